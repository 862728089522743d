"""Software power smoothing in a training process: fill the waits with busy work.

    POWERD_MQTT_PASSWORD=... python examples/fill_during_waits.py \\
        --broker mqtt://job@broker:1883 --cluster prod --node "$(hostname -s)" --gpus 0,1,2,3

On GPUs without hardware power smoothing (H100, A100), the node's agent
(``agent.software_smoothing = true``) tells the jobs on its node how far to
hold each GPU up (``powerd.jobhook.FillFollower``). This example is the job's
side: a ``DutyCycleFiller`` per GPU runs a matmul for a share of every 10 ms
period, and moves the share until NVML's power reading meets the target. The
training loop tells the follower when it waits (a collective, a checkpoint),
works and stops; at its end it keeps filling down the ramp before it exits.

Here the "training" is a loop of sleeps, as in ``examples/train_loop.py``;
in a real job the filler runs on its own CUDA stream beside NCCL's. It needs
``torch`` with CUDA and ``nvidia-ml-py`` (neither is a powerd dependency of
the job hook: install them in the job's environment). ``DutyCycleFiller``
itself needs neither (tests/jobhook/test_fill_example.py drives it with a
modelled GPU).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from powerd.jobhook import FillFollower

# A target rising at least this much at once starts at its estimated share, when the draws
# read so far span at least this much (below, a span of noise would estimate anything).
JUMP_W = 100.0

log = logging.getLogger("fill_during_waits")


class DutyCycleFiller:
    """Holds one GPU near a target power with a kernel run for a share of each period.

    The period is short, 10 ms: on an H200 the draw follows a kernel within tens of
    milliseconds, so a 50 ms period swings it between idle and full load (a 250 W target
    drew up to 411 W on average, ±295 W) where 10 ms holds it within about 2 % (bench/RESULTS.md,
    "The job's busy work on a real GPU").

    Every ``period_s``: run the kernel for ``share × period_s``, rest for the rest,
    then read the power; on a *new* reading, move the share by ``gain × (target −
    power)`` (an integral controller on the duty cycle; clipped to 0..1). A target of 0
    (or below the GPU's own draw) runs nothing.

    A reading is new when it differs from the last one acted on, or ``reading_every_s``
    after it: NVML refreshes the instantaneous power about every 0.1 s (an H100: median
    0.101 s between changes, bench/results/nvml_h100_trace_1.csv), ten of these periods.
    The filler first moved the share every period, so it took one stale error ten times
    over: the loop overshot and swung a few times a second (around a 400 W target,
    ±134-185 W on an H100 and up to ±163 W on an H200, its mean on target; at a job's end
    the fill down swung 130-500 W, the last seconds outside a 300 W/s ramp in
    ``bench_smooth_loop``). ``gain_per_w`` is per reading.

    A target that jumps up by ``JUMP_W`` or more (a wait begins: the job's compute
    stops and the filler must take over at once) starts the share at its estimate,
    ``(target − low) / (high − low)`` from the lowest and highest draws read so far
    (idle, and the job's own compute, which the filler reads while its target is 0). On an
    H200 the draw fell to 112 W for ~0.1 s at every wait while the share climbed
    from 0 (a 350 W dip, 0.15-0.3 s outside a 300 W/s ramp: bench/RESULTS.md,
    "Software smoothing, the whole loop, on an H200").

    A target that moves by less while the filler holds one (a fill down at the ramp-down
    rate, a fill back up at the ramp-up rate before compute resumes) moves the share with
    it, by the change over that span (the share's slope, fed forward): the integral alone
    lags a ramp by rate / gain per reading (27 W a reading at 270 W/s: ~43 W in the tests'
    model, ~100 W on an H100), and a fill back up that lags leaves compute to step up by
    the lag at once. From idle draws alone (a span of noise) a ramp is left to the
    integral. ``run_kernel(seconds)``,
    ``read_power_w()`` and ``sleep(seconds)`` are injected: CUDA, NVML and the clock
    in ``main``, a model of a GPU in the tests.
    """

    def __init__(
        self,
        run_kernel: Callable[[float], None],
        read_power_w: Callable[[], float],
        sleep: Callable[[float], None] = time.sleep,
        period_s: float = 0.01,
        gain_per_w: float = 0.001,
        reading_every_s: float = 0.1,
    ) -> None:
        self.run_kernel, self.read_power_w, self.sleep = run_kernel, read_power_w, sleep
        self.period_s, self.gain_per_w = period_s, gain_per_w
        self.reading_every_s = reading_every_s
        self.target_w = 0.0
        self.share = 0.0
        self.low_w: float | None = None  # the lowest and highest draws read
        self.high_w: float | None = None
        self._acted_on_w: float | None = None  # the last reading the share moved on
        self._since_acted_s = 0.0

    def set_target(self, watts: float) -> None:
        target_w = max(0.0, float(watts))
        low, high = self.low_w, self.high_w
        if low is not None and high is not None and high - low >= JUMP_W:
            span_w = high - low
            if target_w - self.target_w >= JUMP_W:
                guess = (target_w - low) / span_w
                self.share = min(1.0, max(self.share, guess))
            elif self.target_w > 0 and target_w > 0:  # a ramp: follow it, not lag it
                moved = (target_w - self.target_w) / span_w
                self.share = min(1.0, max(0.0, self.share + moved))
        self.target_w = target_w

    def step(self) -> None:
        busy_s = self.share * self.period_s
        if busy_s > 0:
            self.run_kernel(busy_s)
        if self.period_s > busy_s:
            self.sleep(self.period_s - busy_s)
        power_w = self.read_power_w()
        self.low_w = power_w if self.low_w is None else min(self.low_w, power_w)
        self.high_w = power_w if self.high_w is None else max(self.high_w, power_w)
        self._since_acted_s += self.period_s
        if self.target_w <= 0:
            self.share = 0.0
            return
        if power_w == self._acted_on_w and self._since_acted_s < self.reading_every_s:
            return  # the same reading: its error has moved the share already
        self._acted_on_w, self._since_acted_s = power_w, 0.0
        error_w = self.target_w - power_w
        self.share = min(1.0, max(0.0, self.share + self.gain_per_w * error_w))


def cuda_kernel(index: int) -> Callable[[float], None]:  # pragma: no cover - needs a GPU
    import torch

    device = torch.device(f"cuda:{index}")
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    stream = torch.cuda.Stream(device=device)

    def run(seconds: float) -> None:
        # one matmul (~0.2 ms on an H200) at a time: kernels queued faster than the GPU
        # runs them would keep it busy long after ``seconds`` (seen on an H200: a 250 W
        # target drew 510 W on average)
        end = time.monotonic() + seconds
        with torch.cuda.stream(stream):
            while time.monotonic() < end:
                a @ a  # the work is the point
                stream.synchronize()

    return run


def nvml_power(index: int) -> Callable[[], float]:  # pragma: no cover - needs a GPU
    """The GPU's instantaneous power (``NVML_FI_DEV_POWER_INSTANT``) where it has it, as the
    agent reads it: ``nvmlDeviceGetPowerUsage`` is a 1 s average on Ampere and newer, too slow
    for a 50 ms duty cycle (bench/RESULTS.md, "The job's busy work on a real GPU")."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def instant_w() -> float:
        (field,) = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_POWER_INSTANT])
        if field.nvmlReturn != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(field.nvmlReturn)
        return float(field.value.uiVal) / 1000.0

    try:
        instant_w()
    except pynvml.NVMLError:
        return lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
    return instant_w


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - needs a GPU
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=os.environ.get("POWERD_BROKER", ""))
    parser.add_argument("--cluster", default=os.environ.get("POWERD_CLUSTER", "default"))
    parser.add_argument("--node", default=os.uname().nodename.split(".")[0])
    parser.add_argument("--gpus", default="0", help="comma-separated local GPU indices")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step-s", type=float, default=2.0)
    parser.add_argument("--comm-s", type=float, default=0.5)
    parser.add_argument("--idle-w", type=float, default=100.0, help="a GPU's draw at rest")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    indices = [int(i) for i in args.gpus.split(",") if i]
    fillers = {i: DutyCycleFiller(cuda_kernel(i), nvml_power(i)) for i in indices}
    stop = threading.Event()

    def on_fill(node: str, targets: dict[int, float]) -> None:
        for index, watts in targets.items():
            if index in fillers:
                fillers[index].set_target(watts)

    def keep_busy(filler: DutyCycleFiller) -> None:
        while not stop.is_set():
            filler.step()

    follower = FillFollower(args.broker, [args.node], on_fill, cluster=args.cluster)
    follower.start()
    threads = [threading.Thread(target=keep_busy, args=(f,), daemon=True) for f in fillers.values()]
    for thread in threads:
        thread.start()
    try:
        for _ in range(args.steps):
            follower.fill_back_up(timeout_s=60.0)  # after a long wait, before computing
            follower.working()
            time.sleep(args.step_s)  # forward and backward
            follower.waiting(args.comm_s)  # how long it expects to wait
            time.sleep(args.comm_s)  # the exposed all-reduce
        follower.stopping()
        if not follower.wait_ramped(done_w=args.idle_w, timeout_s=300.0):
            log.warning("the fill targets did not reach %g W in 300 s", args.idle_w)
    finally:
        stop.set()
        follower.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
