"""The Grafana dashboards (powerd/grafana, grafana/)."""
