"""Control decisions as pure, vectorised functions over numpy arrays.

No I/O, no clocks, no MQTT: the controller calls them every cycle and the
planner replays profiles through the same functions. Filled in by the cluster
controller work (issue 3).
"""
