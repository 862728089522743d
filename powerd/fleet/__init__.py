"""``powerd fleet``: thousands of simulated agents in one process, against a real broker."""
