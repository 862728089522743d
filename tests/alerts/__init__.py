"""Alert rules: Prometheus (promtool, end to end) and Grafana-provisioned."""
