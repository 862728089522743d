"""Leading by heartbeats, for every tier that does: the site controller, the leaf
controllers and the coordinators.

- ``state``: who leads (``Leadership``): epochs, step-down, takeover; no I/O.
- ``heartbeat``: signed heartbeats and the clean hand-over on a stop.
- ``shell``: the asyncio shell around them (``LeaderShell``): the connection kept up,
  the epoch learnt on each session, the takeover and the heartbeat schedule, the
  systemd watchdog; a service adds its own loop.
"""
