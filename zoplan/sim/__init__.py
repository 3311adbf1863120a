"""One training step, simulated: the task graph (graph), the SimPy simulation with
fair-shared links (simulate), the analytic bounds (bounds) and the one memory model
(memory)."""
