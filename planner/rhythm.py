"""A synchronous training job's power, phase by phase: a profile to replay when none is measured.

What the grid sees of a training site is its rhythm (docs/DOMAIN.md, Llama 3
§3.3.4): every GPU of a job idle, then starting, then computing with a
communication wait every few seconds, pausing for a checkpoint, and stopping,
all at once. ``rhythm_profile`` writes that as a profile table
(``planner.profile_table``), one sample per ``step_s`` per GPU, so that
``powerplan whatif --synchronised`` can replay two such jobs moving together
through the controller's policies and the grid smoothing.

Power in each phase is the GPU's idle power plus the phase's share of the
rise to the compute power: ``idle + load × (compute_w - idle)``, with the
loads of the simulated GPU (``powerd.gpu.simulated.PHASE_PROFILES``: 1.0
computing, 0.2 in a communication wait, 0.05 starting and checkpointing, 0
stopped). A phase shorter than a step is averaged into the step it falls in:
a 0.5 s wait at 1 s steps draws the mean of the two phases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from planner.profile_table import COLUMNS
from powerd.gpu.models import gpu_model
from powerd.gpu.simulated import PHASE_PROFILES

COMPUTE_SHARE_OF_TDP = 0.9  # assumed: the simulated llm-train workload draws ~90 % of its max limit


@dataclass(frozen=True)
class Rhythm:
    """A job's schedule, in seconds from the start of the profile."""

    gpu: str = "GB200"
    compute_w: float | None = None  # None: COMPUTE_SHARE_OF_TDP of the model's max limit
    idle_s: float = 10.0  # before the job starts
    startup_s: float = 20.0
    run_s: float = 600.0  # training, checkpoint pause included
    period_s: float = 10.0  # one communication wait every period_s ...
    comm_s: float = 0.5  # ... this long (exposed communication)
    checkpoints: int = 1  # evenly spread in the run
    checkpoint_s: float = 30.0
    tail_s: float = 120.0  # stopped, after the run: the ramp down
    step_s: float = 0.5

    def __post_init__(self) -> None:
        for name in ("startup_s", "run_s", "period_s", "step_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, not {value}")
        for name in ("idle_s", "comm_s", "checkpoint_s", "tail_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be ≥ 0 s, not {value}")
        if self.comm_s >= self.period_s:
            raise ValueError(f"comm_s ({self.comm_s:g}) must be shorter than period_s")
        if self.checkpoints < 0 or self.checkpoints * self.checkpoint_s >= self.run_s:
            raise ValueError("the checkpoints must fit in the run")
        model = gpu_model(self.gpu)  # KeyError names the known ones
        compute = self.compute_w
        if compute is not None and not model.idle_power_w < compute <= model.cap_max_w:
            raise ValueError(
                f"compute_w {compute:g} W is outside {model.key}'s "
                f"{model.idle_power_w:g}-{model.cap_max_w:g} W"
            )

    @property
    def duration_s(self) -> float:
        return self.idle_s + self.startup_s + self.run_s + self.tail_s

    def phases(self) -> list[tuple[float, float, str]]:
        """(start_s, end_s, phase) from 0 to ``duration_s``, in order, without gaps."""
        out: list[tuple[float, float, str]] = []

        def add(start: float, end: float, phase: str) -> None:
            if end > start:
                out.append((start, end, phase))

        t = 0.0
        add(t, t + self.idle_s, "idle")
        t += self.idle_s
        add(t, t + self.startup_s, "startup")
        t += self.startup_s
        run_end = t + self.run_s
        pauses = [
            t + (k + 1) * self.run_s / (self.checkpoints + 1) for k in range(self.checkpoints)
        ]
        while t < run_end - 1e-9:
            if pauses and t >= pauses[0] - 1e-9:
                pauses.pop(0)
                add(t, t + self.checkpoint_s, "checkpoint")
                t += self.checkpoint_s
                continue
            end = min(t + self.period_s, run_end)
            if pauses:
                end = min(end, pauses[0])
            wait_from = t + self.period_s - self.comm_s
            add(t, min(end, wait_from), "compute")
            add(min(end, wait_from), end, "communication")
            t = end
        add(t, t + self.tail_s, "shutdown")
        return out


def rhythm_series(rhythm: Rhythm) -> tuple[np.ndarray, list[str]]:
    """Per-GPU power per step (each step the mean over the phases in it) and each step's
    phase (the one that fills most of it)."""
    model = gpu_model(rhythm.gpu)
    idle = model.idle_power_w
    compute = rhythm.compute_w or COMPUTE_SHARE_OF_TDP * model.cap_max_w
    n = math.ceil(rhythm.duration_s / rhythm.step_s - 1e-9)
    energy = np.zeros(n)
    most = np.zeros(n)
    phase = ["idle"] * n
    for start, end, name in rhythm.phases():
        power = idle + PHASE_PROFILES[name].load * (compute - idle)
        first = int(start // rhythm.step_s)
        last = min(n - 1, math.ceil(end / rhythm.step_s) - 1)
        for k in range(first, last + 1):
            lo, hi = k * rhythm.step_s, (k + 1) * rhythm.step_s
            overlap = min(hi, end) - max(lo, start)
            if overlap <= 0:
                continue
            energy[k] += power * overlap
            if overlap > most[k]:
                most[k], phase[k] = overlap, name
    return energy / rhythm.step_s, phase


def rhythm_profile(rhythm: Rhythm, workload: str, gpus: int = 8, node: str = "n01") -> pd.DataFrame:
    """The profile table of one node's ``gpus`` GPUs running ``rhythm`` in lock-step."""
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, not {gpus}")
    power, phase = rhythm_series(rhythm)
    n = len(power)
    time_s = np.arange(n) * rhythm.step_s
    table = pd.DataFrame(
        {
            "time_s": np.tile(time_s, gpus),
            "node": node,
            "gpu": np.repeat(np.arange(gpus, dtype=np.int64), n),
            "workload": workload,
            "power_w": np.tile(power, gpus),
            "cap_w": np.nan,
            "cap_max_w": np.nan,
            "clock_mhz": np.nan,
            "phase": np.tile(np.array(phase, dtype=object), gpus),
            "throughput": np.nan,
        }
    )
    return table[list(COLUMNS)]
