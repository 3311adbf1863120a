"""One training step, simulated: the node's links and flows (links), the costs of one
layout gathered from zoplan.pricing (costs), the task graph (graph), the SimPy
simulation with fair-shared links (simulate), the analytic bounds (bounds), many nodes
(nodes) and the one memory model (memory). Nothing here prices a task: every cost is
zoplan.pricing's."""
