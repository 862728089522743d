"""The fleet simulator (powerd/fleet)."""
