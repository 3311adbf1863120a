"""A run's life on disk and on the terminal: the run folder, the loss log, the training
loop with its checkpoints, reports and evaluation."""
