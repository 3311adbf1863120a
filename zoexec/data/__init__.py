"""Training and evaluation data: readers, text packing, tasks and their batches."""
