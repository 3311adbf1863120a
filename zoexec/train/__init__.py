"""One training step of the plan's schedule (the engine) and the speed checks that watch it."""
