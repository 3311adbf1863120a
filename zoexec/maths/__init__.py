"""The zeroth-order maths every layer shares: the seed rule, z, perturbation and update,
the learning-rate schedule, and a step's record (the history a replay needs)."""
