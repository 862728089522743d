"""Open the GPUs an agent manages: NVML on a real node, simulated ones anywhere else."""

from __future__ import annotations

from collections.abc import Sequence

from powerd.gpu.base import Gpu


def open_gpus(simulate: str | None, indices: Sequence[int] | None = None) -> list[Gpu]:
    """``simulate`` like ``"4xH100"`` gives simulated GPUs; None opens NVML devices."""
    if simulate:
        from powerd.gpu.simulated import open_simulated

        gpus: list[Gpu] = list(open_simulated(simulate))
        if indices is not None:
            gpus = [g for g in gpus if g.index in set(indices)]
        return gpus
    from powerd.gpu.nvml import open_nvml

    return list(open_nvml(indices=indices))


def close_gpus(gpus: Sequence[Gpu]) -> None:
    for gpu in gpus:
        gpu.close()
    if any(type(gpu).__name__ == "NvmlGpu" for gpu in gpus):
        from powerd.gpu.nvml import shutdown_nvml

        shutdown_nvml()
