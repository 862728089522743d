"""Demand response: an operator's temporary limit on the site, for whoever applies it
(a site's controller; in a tree of controllers, the coordinator).

- ``limits``: the limits taken, their order and windows, and the glide line down to
  one (``SiteLimits``, ``glide_ramp_w_per_s``); no I/O.
- ``record``: the leader's signed record of the newest limit, the order's floor across
  restarts (``SiteLimitRecord``).
"""
