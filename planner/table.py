"""The planner's one internal form of a power profile, and the error every reader raises.

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
clock_mhz      float64   SM clock (or its lock), MHz; NaN where unknown
phase          string    protocol phase (compute, communication, ...); <NA> unknown
throughput     float64   work per second (samples/s, tokens/s); NaN where unknown
=============  ========  =====================================================

``REQUIRED`` columns must be in every input; the ``OPTIONAL`` ones are filled
with NaN / <NA> when absent.
"""

from __future__ import annotations

from pathlib import Path

REQUIRED: tuple[str, ...] = ("time_s", "node", "gpu", "workload", "power_w")
OPTIONAL: tuple[str, ...] = ("cap_w", "clock_mhz", "phase", "throughput")
COLUMNS: tuple[str, ...] = REQUIRED + OPTIONAL
FLOAT_COLUMNS: tuple[str, ...] = ("time_s", "power_w", "cap_w", "clock_mhz", "throughput")
STRING_COLUMNS: tuple[str, ...] = ("node", "workload", "phase")


class ProfileError(ValueError):
    """Bad planner input. The message names the file and, where there is one, the line.

    ``line`` is 1-based as an editor shows it (for a CSV the header is line 1).
    """

    def __init__(self, source: str | Path, problem: str, line: int | None = None) -> None:
        self.source = str(source)
        self.line = line
        self.problem = problem
        where = self.source if line is None else f"{self.source}:{line}"
        super().__init__(f"{where}: {problem}")


def read_input_text(path: str | Path, what: str = "", kind: str = "text") -> str:
    """A planner input file's text (UTF-8, a byte-order mark dropped), or a ProfileError.

    ``what`` names the input in the message ("the mix"); ``kind`` the format ("TOML").
    """
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        reading = f"cannot read {what}".rstrip()
        raise ProfileError(path, f"{reading}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ProfileError(path, f"not a UTF-8 {kind} file") from None
