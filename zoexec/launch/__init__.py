"""Starting the ranks: local spawn or torchrun, the checks made before anything starts,
each rank's entry, `zoexec eval`'s one-rank launch, and the one-line failure a user reads."""
