"""The processes' runtime: the one device and backend choice, host-memory pinning and
facts, process groups, the clock and the lanes that time every task, the typed failures
they raise (errors), and process identity and stop signals (procwatch)."""
