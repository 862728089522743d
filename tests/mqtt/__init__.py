"""MQTT plumbing: broker URLs, the telemetry receiver, backoff and rate limits."""
