"""The controller's per-GPU cap enforced as a module-scope power limit (GB200), where the
device has one: the agent's ``power_limit_scope = "module"``.

On a GB200 a GPU device also has a power limit of scope ``NVML_POWER_SCOPE_MODULE``,
which bounds the GPU together with its share of the rest of the module.
``ModuleScopeCap`` wraps such a GPU and turns the cap the controller sends for the
GPU, ``cap_w``, into the module limit ``cap_w + (module default - GPU default)``: the
rest of the module keeps the allowance it has by default, and the GPU's own limit stays
at its default. The agent's controls (``powerd.agent.controls``) need no change: they
clamp into ``power_limit_range``, compare with ``power_limit_w`` and write with
``set_power_limit_w``, which here all speak the module limit in GPU watts.

What the wrapper reports as enforced (telemetry ``cap_w``, the ack) is read back from the
device: the lower of the GPU's enforced limit and the module limit less the same
allowance. Whether NVML's enforced GPU limit already reflects the module limit on a
GB200 is not documented (docs/POWER_SMOOTHING.md, "Module-scope power limits").

A module limit the device does not take (read back: nvidia-ml-py drops the setter's
return code) is an error, and the cap is written to the GPU's own limit instead, so that
it holds all the same. ``with_module_scope`` wraps the GPUs that have a module limit and
leaves the others on their GPU limit, saying once per GPU why.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NoReturn

from powerd.gpu.base import POWER_LIMIT_RESOLUTION_W, Gpu, PowerLimitRange
from powerd.gpu.errors import GpuError
from powerd.gpu.wrapped import WrappedGpu

log = logging.getLogger("powerd.gpu")


class ModuleScopeCap(WrappedGpu):
    """A GPU whose power cap is applied as its module-scope power limit."""

    def __init__(self, gpu: Gpu) -> None:
        """``GpuNotSupportedError`` where ``gpu`` has no module limit (the reason in its
        message), ``GpuError`` where its ranges leave no cap the module could enforce."""
        module = gpu.module_power_limit_range()  # raises without module scope
        own = gpu.power_limit_range()
        super().__init__(gpu)
        # What the rest of the module may draw by default: every module limit keeps it.
        self.allowance_w = module.default_w - own.default_w
        limits = self.power_limit_range()
        if limits.min_w > limits.max_w:
            raise GpuError(
                f"GPU {self.index} ({self.name}): module limits {module.min_w:g}-"
                f"{module.max_w:g} W less the rest of the module's {self.allowance_w:g} W "
                f"leave no cap within the GPU's {own.min_w:g}-{own.max_w:g} W"
            )

    def module_limit_for(self, cap_w: float) -> float:
        """The module limit that enforces ``cap_w`` on this GPU, inside the module's range."""
        return self.inner.module_power_limit_range().clamp(cap_w + self.allowance_w)

    # -- the cap, through the module limit ------------------------------------------------

    def power_limit_range(self) -> PowerLimitRange:
        """The caps the module limit can enforce: the GPU's range, narrowed to the module's
        range less the allowance; the default is the GPU's."""
        own = self.inner.power_limit_range()
        module = self.inner.module_power_limit_range()
        return PowerLimitRange(
            min_w=max(own.min_w, module.min_w - self.allowance_w),
            max_w=min(own.max_w, module.max_w - self.allowance_w),
            default_w=own.default_w,
        )

    def power_limit_w(self) -> float:
        """The module limit set now, as a cap on this GPU."""
        return self.inner.module_power_limit_w() - self.allowance_w

    def enforced_cap_w(self) -> float:
        """The lower of the GPU's enforced limit and the module limit as a cap, read back."""
        return min(self.inner.enforced_cap_w(), self.power_limit_w())

    def set_power_limit_w(self, cap_w: float) -> None:
        """Write the module limit for ``cap_w`` (if it differs), then put the GPU's own limit
        at its default (if it is not): lowered first, raised after."""
        limits = self.power_limit_range()
        where = f"GPU {self.index} ({self.name})"
        limits.check(cap_w, "cap (through the module limit)", where)
        module_w = self.module_limit_for(cap_w)
        try:
            if abs(self.inner.module_power_limit_w() - module_w) > POWER_LIMIT_RESOLUTION_W:
                self.inner.set_module_power_limit_w(module_w)
        except GpuError as exc:
            self._hold_on_gpu_limit(cap_w, exc)
        if abs(self.inner.power_limit_w() - limits.default_w) > POWER_LIMIT_RESOLUTION_W:
            self.inner.set_power_limit_w(limits.default_w)

    def _hold_on_gpu_limit(self, cap_w: float, failure: GpuError) -> NoReturn:
        """A module limit not taken: the cap is written to the GPU's own limit, so that it
        holds all the same, and the failure is raised, saying so."""
        try:
            self.inner.set_power_limit_w(cap_w)
        except GpuError:
            raise failure from None
        raise type(failure)(
            f"{failure}; the cap {cap_w:g} W is held by the GPU power limit instead"
        ) from failure


def with_module_scope(gpus: Sequence[Gpu]) -> list[Gpu]:
    """Each GPU with a module-scope power limit wrapped in ``ModuleScopeCap``; the others as
    they are, on their GPU limit, with one warning each saying why."""
    out: list[Gpu] = []
    for gpu in gpus:
        try:
            wrapped = ModuleScopeCap(gpu)
        except GpuError as exc:
            log.warning(
                "gpu %d: power_limit_scope = module, but caps stay on the GPU power limit: %s",
                gpu.index,
                exc,
            )
            out.append(gpu)
            continue
        log.info(
            "gpu %d: caps applied as the module power limit (cap + %g W for the rest of the "
            "module)",
            gpu.index,
            wrapped.allowance_w,
        )
        out.append(wrapped)
    return out
