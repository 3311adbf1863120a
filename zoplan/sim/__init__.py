"""One training step, simulated: the per-task work (taskwork), the node's links and
flows (links), everything one layout costs (costs), the task graph (graph), the SimPy
simulation with fair-shared links (simulate), the analytic bounds (bounds), many nodes
(nodes) and the one memory model (memory)."""
