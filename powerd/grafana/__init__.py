"""Grafana dashboards over the telemetry powerd records (``grafana/`` holds the files)."""
