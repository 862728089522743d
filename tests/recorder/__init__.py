"""The recorders (powerd/recorder) and the telemetry schema they write."""
