"""The node agent (powerd/agent): the daemon against a real broker, its core with a fake clock, its config."""
