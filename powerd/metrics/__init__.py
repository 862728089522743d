"""Prometheus ``/metrics`` endpoints of the agent, the controller and the coordinator.

Off unless ``[metrics] listen`` or ``--metrics-listen`` is given. Each daemon keeps its
own ``CollectorRegistry``; its service updates the gauges from what its core already
holds, once a cycle (controller, coordinator) or a telemetry period (agent), never per
message. ``address`` (the HOST:PORT parser) imports nothing of prometheus_client, so
the config modules may use it.
"""
