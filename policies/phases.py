"""Phases of jobs that do not publish them, inferred from their GPUs' power.

A synchronous training job's GPUs rise and fall together (docs/DOMAIN.md: Llama 3
§3.3.4; Meta: "exposed communication ... induce[s] large, synchronized power
oscillations"). So a job is waiting when most of its GPUs sit well below
their own recent compute level *in the same sample*; how long it has been
waiting tells a collective (short) from a checkpoint (long). A single slow GPU
or a staggered drift is not a phase.

The rule, per job, for the newest sample
----------------------------------------
- A GPU's *compute level* is the ``compute_quantile`` (0.9) quantile of its
  power over the history window (the k-th smallest sample, k = floor(0.9 (n-1)),
  missing samples left out): the level it draws most of the busy time.
  The window should hold some compute (tens of seconds at 1 Hz).
- A sample is *low* for a GPU when its power is below
  ``drop_fraction`` (0.6) of its compute level and at least ``min_drop_w``
  (50 W) under it, so an idle GPU's noise is no drop. GB200 compute draws
  ~1000 W, a collective or a checkpoint a few hundred: a fall to under 60 %
  is a wait, a 10-20 % dip is a lighter kernel.
- The job is *waiting* in a sample when at least ``sync_fraction`` (0.75) of
  its GPUs are low in that sample.
- Waiting in the newest sample: ``communication`` while the run of waiting
  samples that ends there is shorter than ``checkpoint_min_s`` (5 s: a
  collective lasts milliseconds to a second or two; writing a checkpoint takes
  seconds to minutes), ``checkpoint`` from then on. A wait therefore starts as
  ``communication`` and is promoted once it has lasted.
- Not waiting in the newest sample (the job rose together, or never fell):
  ``compute``. GPUs of job -1 (no job): ``compute``.

Every GPU of a job gets the job's phase. With NVML's 1 s power averages
(docs/DOMAIN.md) sub-second collectives are averaged away: only long exposed
communication and checkpoints show; pass instantaneous samples
(``NVML_FI_DEV_POWER_INSTANT``) at a shorter period to see more.
"""

from __future__ import annotations

import numpy as np

from policies.tree import PHASE_CODES

COMPUTE = PHASE_CODES["compute"]
COMMUNICATION = PHASE_CODES["communication"]
CHECKPOINT = PHASE_CODES["checkpoint"]


def infer_phases(
    power_history_w: np.ndarray,
    job_of_gpu: np.ndarray,
    *,
    sample_period_s: float = 1.0,
    drop_fraction: float = 0.6,
    min_drop_w: float = 50.0,
    sync_fraction: float = 0.75,
    checkpoint_min_s: float = 5.0,
    compute_quantile: float = 0.9,
) -> np.ndarray:
    """Phase code (``PHASE_CODES``) per GPU for the newest sample; see the module docstring.

    ``power_history_w`` is (n_gpus, n_samples), oldest first; NaN samples count
    as not low. ``job_of_gpu`` is an int job id per GPU, -1 for none.
    """
    power = np.asarray(power_history_w, dtype=float)
    jobs = np.asarray(job_of_gpu)
    if power.ndim != 2 or power.shape[0] != jobs.shape[0]:
        raise ValueError(
            f"power_history_w must be (n_gpus, n_samples) with n_gpus={jobs.shape[0]}, "
            f"not {power.shape}"
        )
    if not (
        sample_period_s > 0
        and 0 < drop_fraction < 1
        and 0 < sync_fraction <= 1
        and 0 <= compute_quantile <= 1
    ):
        raise ValueError(
            "need sample_period_s > 0, 0 < drop_fraction < 1, 0 < sync_fraction <= 1 "
            "and 0 <= compute_quantile <= 1"
        )
    n_gpus, n_samples = power.shape
    phase = np.full(n_gpus, COMPUTE, dtype=np.int8)
    in_job = np.flatnonzero(jobs >= 0)
    if n_samples == 0 or not len(in_job):
        return phase

    hist = power if len(in_job) == n_gpus else power[in_job]
    level = _row_quantile(hist, compute_quantile)[:, None]
    with np.errstate(invalid="ignore"):
        low = (hist < drop_fraction * level) & (hist <= level - min_drop_w)
    job_ids, job_index = np.unique(jobs[in_job], return_inverse=True)
    n_jobs = len(job_ids)
    gpus_per_job = np.bincount(job_index, minlength=n_jobs)
    starts = np.cumsum(gpus_per_job) - gpus_per_job
    if np.any(np.diff(job_index) < 0):  # GPUs not grouped by job: group them
        low = low[np.argsort(job_index, kind="stable")]
    low_per_job = np.add.reduceat(low, starts, axis=0, dtype=np.intp)
    waiting = low_per_job >= sync_fraction * gpus_per_job[:, None]  # (n_jobs, n_samples)

    # length of the run of waiting samples that ends at the newest sample
    not_waiting_at = np.where(~waiting, np.arange(n_samples), -1)
    last_not_waiting = not_waiting_at.max(axis=1)
    run_s = (n_samples - 1 - last_not_waiting) * sample_period_s
    job_phase = np.where(
        run_s <= 0, COMPUTE, np.where(run_s >= checkpoint_min_s, CHECKPOINT, COMMUNICATION)
    )
    phase[in_job] = job_phase[job_index]
    return phase


def _row_quantile(values: np.ndarray, q: float) -> np.ndarray:
    """Per row, the ``q`` quantile (the k-th smallest, k = floor(q (n - 1))) ignoring NaN.

    ``np.partition`` (linear time) for rows without NaN; for rows with some, a sort (NaN
    last) and each row's own k of its n finite samples; 0 for rows with nothing finite.
    Not ``np.nanquantile``: along an axis it runs a Python loop per row, and at a
    controller's start every row has gaps (2.2 s a cycle for 75K GPUs, found by
    ``bench_controller --jobs 8`` on the 150 MW site).
    """
    finite = np.isfinite(values)
    if not finite.all():
        values = np.where(finite, values, np.nan)
    kth = int(np.floor(q * (values.shape[1] - 1)))
    out = np.partition(values, kth, axis=1)[:, kth]
    gaps = np.flatnonzero(~finite.all(axis=1))
    if len(gaps):
        n_finite = finite[gaps].sum(axis=1)
        k = np.floor(q * (n_finite - 1)).astype(np.intp)
        ranked = np.sort(values[gaps], axis=1)  # NaN last
        picked = ranked[np.arange(len(gaps)), np.maximum(k, 0)]
        out[gaps] = np.where(n_finite > 0, picked, np.nan)
    return np.where(np.isfinite(out), out, 0.0)
