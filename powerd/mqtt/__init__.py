"""MQTT for powerd: which client each part uses, and why.

Each part talks to the broker the way its traffic needs (numbers measured in
bench/RESULTS.md, "scale"):

- **The agent** (``agent/daemon.py``): aiomqtt (asyncio, wrapping paho). A node sends a
  few messages a second; awaiting each publish is simple and cheap there.
- **Controllers and the coordinator, control traffic** (``link.py``): commands, acks,
  heartbeats, grants, site limits and phases through paho's external-loop API on the
  asyncio loop. At site scale that is 2,000+ commands a second: reading drains the
  socket, publishing never waits (aiomqtt awaits each PUBACK, O(n^2) with thousands in
  flight).
- **The controller's telemetry** (``stream.py``): a receive-only MQTT 3.1.1 reader
  written here. 20,736 QoS 0 messages a second cost paho ~20 us of Python each, most of
  a core before any decoding; here only the topic and payload are made per message,
  and a frame too large is skipped as it streams past.
- **The fleet simulator** (``fleet/runner.py``, ``fleet/wire.py``): paho for commands
  and acks, QoS 0 PUBLISH frames written by hand for telemetry (one process plays
  20,736 agents).
- **The job hook** (``jobhook/``): paho in a thread (a training process must not need
  an event loop); ``powerd limit``: aiomqtt for its one message.

Also here: broker URLs and credentials (``url.py``, the one parser every role uses),
reconnecting with backoff (``session.py``), and the demo's embedded broker
(``embedded_broker.py``, amqtt, the demo only). Nothing in this package imports any
other part of powerd but ``powerd.backoff``.
"""
