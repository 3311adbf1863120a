"""The processes' runtime: the one device and backend choice, host-memory pinning and
facts, process groups, the clock and the lanes that time every task, and process identity."""
