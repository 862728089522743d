"""The SM clock to lock from measured frequency sweeps of training stages (``powerplan clocks``).

Input: a Perseus stage profile (SOSP '24; ``tests/data/perseus-frequency/``), one row
per pipeline stage, instruction (forward or backward) and SM frequency with the
time and energy of one micro-batch computation.

The aggregate: one training step of a pipeline (1F1B) with every GPU locked at the
same clock. In steady state each stage computes one forward and one backward per
micro-batch, and the pipeline moves at the pace of its slowest stage, so the
step's time scales with ``max over stages of (forward + backward time)``; every
stage runs on its own GPU and does its work whatever the others do, so the step's
energy is the ``sum over stages and instructions of energy``. (Summing the times
instead would describe one GPU running every stage in turn; on these files the
two differ by at most 0.2 % in relative time, as every stage slows down alike, and
recommend the same clocks at 0.5 %, 1 %, 2 %, 5 % and 20 % slowdown; at 10 % on
GPT-3 175B the sum picks 1215 MHz, the pipeline 1230 MHz.) The energy GPUs spend
waiting for the slowest stage is not in the profiles and not counted: GPT-3 175B's
last stage takes 7 % longer than the seven others (so they wait ~6 % of a step),
BLOOM's takes 11 % less (it waits). At, say, 100 W per waiting GPU that is ~1.2 %
of GPT-3's step energy, growing with the step time: ~0.06 points more at 1290 MHz
than at 1410 MHz, too little to move a recommendation.

Both are normalised to the highest measured clock, giving a
``powerd.gpu.clock_table.ClockTable``; ``best_clock`` picks the clock per allowed
slowdown.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.errors import ProfileError, read_input_text
from powerd.gpu.clock_table import ClockTable, best_clock
from powerd.gpu.models import GPU_MODELS, gpu_model

PROFILE_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
INSTRUCTIONS = ("forward", "backward")


@dataclass(frozen=True)
class StageProfile:
    """One Perseus file, checked: time and energy by (stage, instruction, frequency)."""

    source: str
    workload: str  # the file name's part before '+': "gpt3-175b"
    frequencies_mhz: tuple[int, ...]  # ascending
    stages: tuple[str, ...]
    time_s: dict[tuple[str, str, int], float]
    energy_j: dict[tuple[str, str, int], float]


@dataclass(frozen=True)
class Recommendation:
    """The clock to lock for one allowed slowdown."""

    max_slowdown: float
    clock_mhz: float
    slowdown: float  # time_rel - 1 at that clock
    power_rel: float
    energy_saved: float  # share of the energy per step at the highest clock


def workload_of(path: str | Path) -> str:
    """``gpt3-175b+a100_sxm_bf16.csv`` -> ``gpt3-175b``."""
    return Path(path).stem.split("+", 1)[0]


def model_of(path: str | Path) -> str | None:
    """The GPU model a Perseus file name names after '+' (``a100_sxm_bf16`` -> ``A100``)."""
    stem = Path(path).stem
    if "+" not in stem:
        return None
    first = stem.split("+", 1)[1].split("_", 1)[0]
    return next((key for key in GPU_MODELS if key.lower() == first.lower()), None)


def read_stage_profile(path: str | Path) -> StageProfile:
    """Read and check one Perseus stage profile; ``ProfileError`` with the file and line."""
    text = read_input_text(path, "the stage profile", "CSV")
    reader = csv.reader(text.splitlines())
    header = [c.strip() for c in next(reader, [])]
    missing = [c for c in PROFILE_COLUMNS if c not in header]
    if missing:
        raise ProfileError(
            path,
            f"missing column(s) {', '.join(missing)}: a Perseus stage profile has "
            f"{','.join(PROFILE_COLUMNS)}",
            line=1,
        )
    at = {name: header.index(name) for name in PROFILE_COLUMNS}
    time_s: dict[tuple[str, str, int], float] = {}
    energy_j: dict[tuple[str, str, int], float] = {}
    for number, cells in enumerate(reader, start=2):
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise ProfileError(path, f"{len(cells)} values for {len(header)} columns", number)
        key, t, e = _row(path, number, {name: cells[i].strip() for name, i in at.items()})
        if key in time_s:
            raise ProfileError(
                path, f"stage {key[0]} {key[1]} at {key[2]} MHz is given twice", number
            )
        time_s[key], energy_j[key] = t, e
    if not time_s:
        raise ProfileError(path, "no rows")
    return _complete(path, time_s, energy_j)


def _row(
    path: str | Path, number: int, cell: dict[str, str]
) -> tuple[tuple[str, str, int], float, float]:
    instruction = cell["instruction"]
    if instruction not in INSTRUCTIONS:
        raise ProfileError(
            path, f"instruction {instruction!r} is not {' or '.join(INSTRUCTIONS)}", number
        )
    try:
        frequency, t, e = float(cell["frequency"]), float(cell["time"]), float(cell["energy"])
    except ValueError:
        values = ", ".join(f"{k} {cell[k]!r}" for k in ("frequency", "time", "energy"))
        raise ProfileError(path, f"not a number: {values}", number) from None
    if 0 < frequency < 100:
        hint = f"; in GHz? write {frequency * 1000:g}" if frequency < 10 else ""
        raise ProfileError(path, f"frequency {frequency:g} MHz is implausible{hint}", number)
    if not (math.isfinite(frequency) and frequency > 0 and frequency == int(frequency)):
        raise ProfileError(path, f"frequency {cell['frequency']!r} is not a whole MHz > 0", number)
    if not (math.isfinite(t) and t > 0 and math.isfinite(e) and e > 0):
        raise ProfileError(path, f"time {t:g} s and energy {e:g} J must be > 0", number)
    return (cell["stage"], instruction, int(frequency)), t, e


def _complete(
    path: str | Path,
    time_s: dict[tuple[str, str, int], float],
    energy_j: dict[tuple[str, str, int], float],
) -> StageProfile:
    """Every (stage, instruction) at every frequency, or an error naming what is missing."""
    stages = tuple(sorted({k[0] for k in time_s}, key=lambda s: (len(s), s)))
    frequencies = tuple(sorted({k[2] for k in time_s}))
    if len(frequencies) < 2:
        raise ProfileError(path, f"one frequency only ({frequencies[0]} MHz): nothing to compare")
    wanted = [(s, i, f) for s in stages for i in INSTRUCTIONS for f in frequencies]
    absent = [k for k in wanted if k not in time_s]
    if absent:
        shown = "; ".join(f"stage {s} {i} at {f} MHz" for s, i, f in absent[:3])
        more = f" and {len(absent) - 3} more" if len(absent) > 3 else ""
        raise ProfileError(
            path,
            f"every stage needs a forward and a backward at every frequency; missing: "
            f"{shown}{more}",
        )
    return StageProfile(str(path), workload_of(path), frequencies, stages, time_s, energy_j)


def step_table(profile: StageProfile, model: str) -> ClockTable:
    """One training step per frequency (slowest stage's time, every stage's energy; see the
    module doc), relative to the highest frequency."""
    freqs = profile.frequencies_mhz
    time_s = np.array(
        [
            max(sum(profile.time_s[(s, i, f)] for i in INSTRUCTIONS) for s in profile.stages)
            for f in freqs
        ]
    )
    energy_j = np.array(
        [
            sum(profile.energy_j[(s, i, f)] for s in profile.stages for i in INSTRUCTIONS)
            for f in freqs
        ]
    )
    time_rel = time_s / time_s[-1]
    energy_rel = energy_j / energy_j[-1]
    source = (
        f"Perseus (SOSP '24) stage profile {Path(profile.source).name} "
        f"(ml-energy/zeus sosp24_data/emulation/stage_profile, Apache-2.0): one pipeline step, "
        f"time of the slowest of {len(profile.stages)} stages, energy of all"
    )
    return ClockTable(
        gpu_model(model).key, np.array(freqs, float), time_rel, energy_rel / time_rel, source
    )


def recommend(table: ClockTable, max_slowdowns: Iterable[float]) -> list[Recommendation]:
    """``best_clock`` for each allowed slowdown, with the slowdown and power it comes with."""
    out = []
    for max_slowdown in max_slowdowns:
        clock, saved = best_clock(table, max_slowdown)
        time_rel, power_rel = table.at(clock)
        out.append(Recommendation(max_slowdown, clock, time_rel - 1.0, power_rel, saved))
    return out
