"""powerd demo (powerd/demo)."""
