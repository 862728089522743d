"""The node agent: reads GPUs, publishes telemetry, applies caps, keeps the node safe alone."""
