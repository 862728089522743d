"""The training-job hook (powerd/jobhook)."""
