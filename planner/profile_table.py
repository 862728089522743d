"""The planner's one internal form of a power profile: the columns of the profile table.

Every reader (CSV, Parquet, InfluxDB line protocol, an InfluxDB query) turns
its input into one ``pandas.DataFrame`` with these columns, sorted by
(workload, node, gpu, time_s):

=============  ========  =====================================================
column         dtype     meaning
=============  ========  =====================================================
time_s         float64   Unix seconds (or seconds from any origin, same for all)
node           string    server name
gpu            int64     GPU index on the node
workload       string    job or workload name (the unit of correlation)
power_w        float64   GPU power, W (finite, >= 0)
cap_w          float64   power cap in force, W; NaN where unknown
cap_max_w      float64   the GPU's highest power cap, W; NaN where unknown
                         (with cap_w it tells a capped sample: planner.censored)
clock_mhz      float64   SM clock (or its lock), MHz; NaN where unknown
phase          string    protocol phase (compute, communication, ...); <NA> unknown
throughput     float64   work per second (samples/s, tokens/s); NaN where unknown
=============  ========  =====================================================

``REQUIRED`` columns must be in every input; the ``OPTIONAL`` ones are filled
with NaN / <NA> when absent.
"""

from __future__ import annotations

REQUIRED: tuple[str, ...] = ("time_s", "node", "gpu", "workload", "power_w")
OPTIONAL: tuple[str, ...] = ("cap_w", "cap_max_w", "clock_mhz", "phase", "throughput")
COLUMNS: tuple[str, ...] = REQUIRED + OPTIONAL
FLOAT_COLUMNS: tuple[str, ...] = (
    "time_s",
    "power_w",
    "cap_w",
    "cap_max_w",
    "clock_mhz",
    "throughput",
)
STRING_COLUMNS: tuple[str, ...] = ("node", "workload", "phase")
