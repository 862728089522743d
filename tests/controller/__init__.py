"""The cluster controller (powerd/controller): its pure parts with a fake clock, and real clusters."""
