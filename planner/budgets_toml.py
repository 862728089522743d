"""Write a sized topology as a budgets file (docs/BUDGETS.md) the controller and agents load.

Rows and racks are listed one by one (each has its own sized budget); the
nodes of a rack become one generator where they share every setting and
their names follow ``<prefix><number>``, and are listed otherwise. Limits,
ramps, capping bands, node budgets and GPU models are the input topology's;
budgets of racks, rows and the site, overheads and the failsafe cap per
model are the sizing's. The site's ``[site.grid]`` (its grid spec) is the input
topology's, written in W/s and seconds. :func:`check_round_trip` loads the text
back with ``powerd.topology.parse_budgets`` and compares every number.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from planner.sizing import Sizing, SizingError
from policies.tree import SERVER
from powerd.gpu.clock_table import COLUMNS, ClockTable
from powerd.topology import Topology, parse_budgets
from powerd.topology.grid import GridSpec

_THRESHOLDS = ("cap_threshold", "cap_target", "uncap_threshold")
_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def _num(value: float) -> str:
    value = float(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _grid_keys(grid: GridSpec) -> list[str]:
    """The ``[site.grid]`` keys that load back as ``grid``: ramps in W/s (left out when
    unlimited), every window and the band written out, the floor and the share only
    when set (``floor_window_s`` only with a floor: the loader refuses it alone)."""
    out = []
    for key, value in (
        ("ramp_up_w_per_s", grid.ramp_up_w_per_s),
        ("ramp_down_w_per_s", grid.ramp_down_w_per_s),
    ):
        if math.isfinite(value):
            out.append(f"{key} = {_num(value)}")
    out.append(f"window_s = {_num(grid.window_s)}")
    if grid.floor_fraction is not None:
        out.append(f"floor_fraction = {_num(grid.floor_fraction)}")
        out.append(f"floor_window_s = {_num(grid.floor_window_s)}")
    lo, hi = grid.oscillation_band_hz
    out.append(f"oscillation_band_hz = [{_num(lo)}, {_num(hi)}]")
    if grid.oscillation_max_share is not None:
        out.append(f"oscillation_max_share = {_num(grid.oscillation_max_share)}")
    out.append(f"oscillation_window_s = {_num(grid.oscillation_window_s)}")
    if grid.oscillation_min_rms_w > 0:
        out.append(f"oscillation_min_rms_w = {_num(grid.oscillation_min_rms_w)}")
    return out


def _str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _comm_clock_lines(top: Topology, model: str) -> list[str]:
    """The keys that chose ``model``'s communication clock, as the input gave them: a
    ``comm_max_slowdown`` keeps its clock table, which the simulators answer a lock from."""
    keys = top.comm_clock_keys.get(model)
    if keys:
        return [f"{k} = {_str(v) if isinstance(v, str) else _num(v)}" for k, v in keys.items()]
    clock = float(top.comm_clock_mhz.get(model, math.nan))
    return [f"comm_clock_mhz = {_num(clock)}"] if math.isfinite(clock) else []


class _Writer:
    def __init__(self, top: Topology, sizing: Sizing) -> None:
        self.top = top
        self.s = sizing
        order = np.argsort(top.parent, kind="stable")
        parents = top.parent[order]
        left = np.searchsorted(parents, np.arange(top.n_nodes), side="left")
        right = np.searchsorted(parents, np.arange(top.n_nodes), side="right")
        self.children = [order[a:b] for a, b in zip(left, right, strict=True)]
        self.thresholds = np.stack([np.asarray(getattr(top, k), dtype=float) for k in _THRESHOLDS])
        self.risk = sizing.table.set_index("name") if len(sizing.table) else pd.DataFrame()
        self.lines: list[str] = []

    def power_keys(self, node: int) -> list[str]:
        out = [
            f"limit_w = {_num(self.s.limit_w[node])}",
            f"budget_w = {_num(self.s.budget_w[node])}",
        ]
        if self.s.overhead_w[node] > 0:
            out.append(f"overhead_w = {_num(self.s.overhead_w[node])}")
        if len(self.s.oversubscription_w) and self.s.oversubscription_w[node] > 0:
            out.append(f"oversubscription_w = {_num(self.s.oversubscription_w[node])}")
            out.append(f"rise_margin_w = {_num(self.s.rise_margin_w[node])}")
        ramp = float(self.top.ramp_w_per_s[node])
        if math.isfinite(ramp):
            out.append(f"ramp_w_per_s = {_num(ramp)}")
        parent = int(self.top.parent[node])
        for k, key in enumerate(_THRESHOLDS):
            if parent >= 0 and self.thresholds[k, node] != self.thresholds[k, parent]:
                out.append(f"{key} = {_num(self.thresholds[k, node])}")
        return out

    def comment(self, node: int) -> str:
        name = self.top.names[node]
        if name not in self.risk.index:
            return ""
        r = self.risk.loc[name]
        return (
            f"# {name}: sized demand {r['demand_q_w']:,.0f} W ({r['tail_model']} tail,"
            f" n_eff {r['n_eff']:,}); budget bound by the {r['bound']}\n"
            f"# uncapped demand above the capping threshold {r['capping_s_per_day']:.3g} s/day,"
            f" above the limit {r['over_limit_s_per_day']:.3g} s/day"
        )

    def write(self, header: list[str]) -> str:
        top, lines = self.top, self.lines
        lines += [f"# {h}" if h else "#" for h in header]
        lines += ["version = 1", "", "[defaults]"]
        lines += [f"{k} = {_num(self.thresholds[i, 0])}" for i, k in enumerate(_THRESHOLDS)]
        lines += ["", self.comment(0), "[site]", f"name = {_str(top.site)}", *self.power_keys(0)]
        if top.grid is not None:
            lines += ["", "[site.grid]", *_grid_keys(top.grid)]
        for model, cap in self.s.failsafe_cap_w.items():
            lines += ["", f"[models.{model}]", f"failsafe_cap_w = {_num(cap)}"]
            lines += _comm_clock_lines(top, model)
        for row in self.children[0]:
            lines += ["", self.comment(row), "[[rows]]", f"name = {_str(top.names[row])}"]
            lines += self.power_keys(row)
            for rack in self.children[row]:
                lines += ["", self.comment(rack), "[[rows.racks]]"]
                lines += [f"name = {_str(top.names[rack])}", *self.power_keys(rack)]
                self.nodes(rack)
        return "\n".join(line for line in lines if line is not None) + "\n"

    def node_keys(self, node: int) -> list[str]:
        k = node - self.top.level_start[SERVER]
        return [
            f"gpus = {int(self.top.server_gpu_count[k])}",
            f"model = {_str(self.top.server_model[k])}",
            *self.power_keys(node),
        ]

    def nodes(self, rack: int) -> None:
        nodes = self.children[rack]
        keys = [self.node_keys(int(n)) for n in nodes]
        template = None
        if len(nodes) > 1 and all(k == keys[0] for k in keys):
            template = _template(self.top.names[rack], [self.top.names[int(n)] for n in nodes])
        if template is not None:
            name, start = template
            self.lines += ["", "[rows.racks.nodes]", f"count = {len(nodes)}"]
            if start != 1:
                self.lines.append(f"start = {start}")
            self.lines += [f"name = {_str(name)}", *keys[0]]
            return
        for node, k in zip(nodes, keys, strict=True):
            self.lines += ["", "[[rows.racks.nodes]]", f"name = {_str(self.top.names[int(node)])}"]
            self.lines += k


def _template(rack: str, names: list[str]) -> tuple[str, int] | None:
    """A name template and start for consecutive ``<prefix><number>`` names, else None."""
    parts = [_NUMBERED.match(n) for n in names]
    if any(p is None for p in parts):
        return None
    prefix = parts[0].group(1)  # type: ignore[union-attr]
    start = int(parts[0].group(2))  # type: ignore[union-attr]
    field = "{rack}" + prefix[len(rack) :] if prefix.startswith(rack) else prefix
    width = len(parts[0].group(2))  # type: ignore[union-attr]
    specs = ("{i}",) if width == 1 else (f"{{i:0{width}d}}", "{i}")
    for spec in specs:
        fmt = f"{{:0{width}d}}" if spec != "{i}" else "{}"
        if all(n == prefix + fmt.format(start + k) for k, n in enumerate(names)):
            return field + spec, start
    return None


def budgets_toml(top: Topology, sizing: Sizing, header: list[str] | None = None) -> str:
    """The budgets file text for a sized topology, checked to load back unchanged."""
    text = _Writer(top, sizing).write(header or [])
    check_round_trip(text, top, sizing)
    return text


def check_round_trip(text: str, top: Topology, sizing: Sizing) -> None:
    """Load ``text`` as the controller would; every name and number must come back."""
    back = parse_budgets(text, source="<powerplan size output>")
    if back.names != top.names:
        raise SizingError("the budgets file written does not list the topology's tree nodes")
    for name, want, got in (
        ("limit_w", sizing.limit_w, back.limit_w),
        ("budget_w", sizing.budget_w, back.budget_w),
        ("overhead_w", sizing.overhead_w, back.overhead_w),
        ("ramp_w_per_s", top.ramp_w_per_s, back.ramp_w_per_s),
        ("cap_threshold", top.cap_threshold, back.cap_threshold),
        ("cap_target", top.cap_target, back.cap_target),
        ("uncap_threshold", top.uncap_threshold, back.uncap_threshold),
        ("server_gpu_count", top.server_gpu_count, back.server_gpu_count),
        ("oversubscription_w", *_both(sizing.oversubscription_w, back.oversubscription_w, top)),
        ("rise_margin_w", *_both(sizing.rise_margin_w, back.rise_margin_w, top)),
        (
            "failsafe_cap_w",
            np.array([sizing.failsafe_cap_w[m] for m in top.server_model]),
            back.server_failsafe_cap_w,
        ),
    ):
        if not np.array_equal(np.asarray(want, dtype=float), np.asarray(got, dtype=float)):
            raise SizingError(f"the budgets file written does not load back the same {name}")
    if back.server_model != top.server_model:
        raise SizingError("the budgets file written does not load back the same GPU models")
    if back.grid != top.grid:
        raise SizingError("the budgets file written does not load back the same [site.grid]")
    for model in sorted(set(top.server_model)):
        clocks = [t.comm_clock_mhz.get(model, math.nan) for t in (top, back)]
        same_table = _same_table(top.clock_table(model), back.clock_table(model))
        if not np.array_equal(clocks[0], clocks[1], equal_nan=True) or not same_table:
            raise SizingError(
                f"the budgets file written does not load back the same {model} communication "
                "clock and clock table"
            )


def _both(want: np.ndarray, got: np.ndarray | None, top: Topology) -> tuple[np.ndarray, np.ndarray]:
    """An oversubscription column written and read back, absent ones as zeros."""
    zeros = np.zeros(top.n_nodes)
    return (want if len(want) else zeros), (zeros if got is None else got)


def _same_table(a: ClockTable | None, b: ClockTable | None) -> bool:
    """The same numbers (wherever read from: a path written absolute reads the same file)."""
    if a is None or b is None:
        return a is b
    return a.model == b.model and all(
        np.array_equal(getattr(a, column), getattr(b, column)) for column in COLUMNS
    )
