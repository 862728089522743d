"""Grid smoothing in software on this node's GPUs, the whole loop: the site's measured ramp
with it off and on.

    sudo python -m bench.bench_smooth_loop --json smooth.json     # NVML and PyTorch, as root
    python -m bench.bench_smooth_loop --simulate 1xH100            # the plumbing only

As ``bench_loop`` (a broker, ``powerd agent`` and ``powerd controller`` processes), with
a ``[site.grid]`` of ``RAMP_W_PER_S_PER_GPU`` x GPUs each way over 1 s. A job starts,
computes (a bf16 matmul loop) in 4 s steps parted by 1.5 s of exposed communication (the
GPUs idle; ``RHYTHM``), and stops; with ``--checkpoint-s``, a checkpoint of that long
(the GPUs idle, the caps staged) comes before the last step, after which the job fills
its GPUs back up at the ramp-up rate before computing (``FillFollower.wait_risen``;
``--no-rise-first``: it computes at once). Run twice: smoothing off, then on (``powerd controller
--grid-smoothing``, ``agent.software_smoothing``, and the job filling its waits with
``examples/fill_during_waits.py``'s ``DutyCycleFiller`` to the agent's targets through a
``powerd.jobhook.FillFollower``). The node's draw is read every 50 ms through NVML and
measured as the controller measures a site (``policies.grid.ramp_stats``): the highest
rise and fall over 1 s, and the seconds outside the limits; with the energy over the run.

On simulated GPUs the draw lives in the agent's process, out of the job's reach: the run
shows that the fill requests reach the job with the profile's rates, nothing more.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_fill import example
from bench.bench_loop import (
    NODE,
    BusWatch,
    Load,
    Node,
    NvmlWatch,
    agent_toml,
    budgets_toml,
    generate_keys,
    open_broker,
    open_node,
    processes,
    put_back,
    wait_for,
)
from bench.common import machine, report
from policies.grid import ramp_stats
from powerd.jobhook import FillFollower, PhaseReporter

RAMP_W_PER_S_PER_GPU = 300.0  # the grid spec's ramp, each way, per GPU of the node
WINDOW_S = 1.0
FAILSAFE_FRACTION = 0.6
RHYTHM = {"startup_s": 2.5, "compute_s": 4.0, "comm_s": 1.5, "steps": 3}
QUICK = {"startup_s": 1.0, "compute_s": 1.0, "comm_s": 1.0, "steps": 1}
SERIES_DT_S = 0.05  # the NVML samples, put on this grid


def grid_budgets(node: Node, failsafe_w: float) -> str:
    ramp = RAMP_W_PER_S_PER_GPU * node.gpus
    grid = f"[site.grid]\nramp_up_w_per_s = {ramp:g}\nramp_down_w_per_s = {ramp:g}\n"
    grid += f"window_s = {WINDOW_S:g}\n"
    return budgets_toml(node.model, node.gpus, failsafe_w).replace("[models.", grid + "[models.", 1)


class Job:
    """The training process: phases, a matmul loop while it computes, and (smoothing on)
    a filler per GPU holding the agent's fill targets."""

    def __init__(
        self,
        url: str,
        node: Node,
        smoothing: bool,
        rhythm: dict[str, float],
        checkpoint_s: float = 0.0,
        rise_first: bool = True,
    ) -> None:
        self.node = node
        self.rhythm = rhythm
        self.checkpoint_s = checkpoint_s
        self.rise_first = rise_first
        self.rise_first_s = 0.0  # compute waited this long for the GPUs to fill back up
        self.rises: list[dict[str, Any]] = []  # each fill back up: its targets and levels
        self.reporter = PhaseReporter(url, "smooth-job", [NODE], flush_timeout_s=2.0)
        self.requests = 0
        self.targets: list[dict[int, float]] = []
        self._stop = threading.Event()
        self._fillers: dict[int, Any] = {}
        self._threads: list[threading.Thread] = []
        self.follower: FillFollower | None = None
        self._running: Load | None = None  # the matmul loops computing now
        self._next: Load | None = None  # those of the next step, made during the wait
        if smoothing:
            self.follower = FillFollower(url, [NODE], self._on_fill)
            if node.nvml is not None:
                ex = example()
                self._fillers = {
                    g.index: ex.DutyCycleFiller(ex.cuda_kernel(g.index), ex.nvml_power(g.index))
                    for g in node.nvml
                }

    def _on_fill(self, _node: str, targets: dict[int, float]) -> None:
        self.requests += 1
        self.targets.append(dict(targets))
        for index, watts in targets.items():
            if index in self._fillers:
                self._fillers[index].set_target(watts)

    def start(self) -> None:
        if self.follower is not None:
            self.follower.start()
        for filler in self._fillers.values():
            thread = threading.Thread(target=self._keep_busy, args=(filler,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _keep_busy(self, filler: Any) -> None:
        while not self._stop.is_set():
            filler.step()

    def compute(self, seconds: float, after_checkpoint: bool = False) -> None:
        """Compute resumes, then the filler stands down, as a training loop would order
        them (the loops are made beforehand: allocating them takes ~0.1 s). After a
        checkpoint, or a wait that fell further than a window's rise, the GPUs fill back up
        first, still announced as the wait (docs/JOBHOOK.md)."""
        follower = self.follower
        if follower is not None and self.rise_first:
            started = time.monotonic()
            before = follower.targets(NODE)
            risen = follower.fill_back_up(timeout_s=30.0, after_checkpoint=after_checkpoint)
            took_s = time.monotonic() - started
            if after_checkpoint:  # what the follower saw there
                self.rises.append(
                    {
                        "before_w": before,
                        "risen": risen,
                        "to_w": follower.targets(NODE),
                        "resume_w": follower.resume_levels(NODE),
                        "s": round(took_s, 3),
                    }
                )
            self.rise_first_s += took_s
            seconds = max(0.0, seconds - took_s)
        self._running, self._next = self._next or Load(self.node), None
        self._running.start()
        if self.follower is not None:
            self.follower.working()
        self.reporter.set_phase("compute")
        time.sleep(seconds)

    def wait(self, seconds: float, phase: str = "communication") -> None:
        """The filler takes over, then compute stops; the next step's loops are made now."""
        t_end = time.monotonic() + seconds
        if self.follower is not None:
            self.follower.waiting()
        self.reporter.set_phase(phase, expected_s=seconds)
        self._stop_running()
        self._next = Load(self.node)
        time.sleep(max(0.0, t_end - time.monotonic()))

    def _stop_running(self) -> None:
        if self._running is not None:
            self._running.stop()
        self._running = None

    def run(self, marks: list[tuple[float, str]]) -> None:
        marks.append((time.monotonic(), "startup"))
        r = self.rhythm
        self.reporter.startup(expected_s=r["startup_s"])
        if self.follower is not None:
            self.follower.starting()
        t_end = time.monotonic() + r["startup_s"]
        self._next = Load(self.node)  # loading the model
        time.sleep(max(0.0, t_end - time.monotonic()))
        for step in range(int(r["steps"])):
            marks.append((time.monotonic(), f"compute {step + 1}"))
            self.compute(r["compute_s"])
            marks.append((time.monotonic(), f"communication {step + 1}"))
            self.wait(r["comm_s"])
        if self.checkpoint_s > 0:
            marks.append((time.monotonic(), "checkpoint"))
            self.wait(self.checkpoint_s, "checkpoint")
        marks.append((time.monotonic(), "last compute"))
        self.compute(r["compute_s"], after_checkpoint=self.checkpoint_s > 0)
        marks.append((time.monotonic(), "shutdown"))
        if self.follower is not None:
            self.follower.stopping()
        self._stop_running()
        self.reporter.shutdown(2.0)
        if self.follower is not None:
            # an H200 idles at 79-126 W (docs/HARDWARE.md): done within 130 W a GPU
            self.follower.wait_ramped(done_w=130.0, timeout_s=30.0)
        marks.append((time.monotonic(), "ramped down"))

    def close(self) -> None:
        self._stop_running()
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        if self.follower is not None:
            self.follower.close()
        self.reporter.close(1.0)


def one_run(args: argparse.Namespace, node: Node, smoothing: bool) -> dict[str, Any]:
    failsafe_w = round(FAILSAFE_FRACTION * node.max_w)
    work = Path(tempfile.mkdtemp(prefix="bench-smooth-"))
    broker, url = open_broker(args.broker)
    nvml = NvmlWatch(node.nvml) if node.nvml is not None else None
    bus = BusWatch(url)
    rhythm = QUICK if args.quick else RHYTHM
    job = Job(url, node, smoothing, rhythm, args.checkpoint_s, args.rise_first)
    marks: list[tuple[float, str]] = []
    out: dict[str, Any] = {"smoothing": smoothing}
    try:
        with processes() as start:
            generate_keys(work / "ctl")
            (work / "budgets.toml").write_text(grid_budgets(node, failsafe_w))
            agent_text = agent_toml(url, work / "ctl.pub", failsafe_w, 10.0, 0.1)
            if smoothing:
                agent_text = agent_text.replace("[agent]\n", "[agent]\nsoftware_smoothing = true\n")
            (work / "agent.toml").write_text(agent_text)
            simulate = ["--simulate", args.simulate] if args.simulate else []
            agent = start(
                "agent",
                ["agent", "--config", str(work / "agent.toml"), "--node", NODE, *simulate],
                work / "agent.log",
            )
            wait_for("agent telemetry", lambda: bus.last() is not None, 60, agent)
            grid = ["--grid-smoothing"] if smoothing else ["--no-grid-smoothing"]
            controller = start(
                "controller",
                [
                    "controller",
                    *("--budgets", str(work / "budgets.toml"), "--broker", url),
                    *("--signing-key", str(work / "ctl.key"), "--cycle-s", "0.5", "--no-record"),
                    *grid,
                ],
                work / "controller.log",
            )
            wait_for("the first ack", lambda: bool(bus.acks), 60, agent, controller)
            time.sleep(1.0)  # idle, settled
            job.start()
            t0 = time.monotonic()
            job.run(marks)
            time.sleep(0.5)
            t1 = time.monotonic()
            out["job_s"] = round(t1 - t0, 1)
            out["fill_requests"] = job.requests
            out["fill_targets_seen_w"] = _range(job.targets)
            out["rise_first_s"] = round(job.rise_first_s, 2)
            out["rises"] = job.rises
            if nvml is not None:
                out.update(measure(nvml, node, t0 - 1.0, t1))
    except TimeoutError as exc:
        out["error"] = str(exc)
    finally:
        out["agent_log_warnings"] = _lines(work / "agent.log", "WARNING")
        out["controller_log_warnings"] = _lines(work / "controller.log", "WARNING")
        job.close()
        bus.close()
        if nvml is not None:
            nvml.stop()
            if args.trace and marks:
                write_trace(args.trace, smoothing, nvml, marks)
        if broker is not None:
            broker.close()
    return out


def write_trace(
    path: Path, smoothing: bool, nvml: NvmlWatch, marks: list[tuple[float, str]]
) -> None:
    """The node's draw as CSV beside ``path`` (``_off``/``_on``), the phases as # lines."""
    t0 = marks[0][0]
    rows = ["t_s,power_w"] + [f"{t - t0:.3f},{sum(p):.1f}" for t, p, _, _ in nvml.samples]
    rows += [f"# {t - t0:.3f} {what}" for t, what in marks]
    name = f"{path.stem}_{'on' if smoothing else 'off'}{path.suffix or '.csv'}"
    path.with_name(name).write_text("\n".join(rows) + "\n")


def measure(nvml: NvmlWatch, node: Node, t0: float, t1: float) -> dict[str, Any]:
    """The node's draw on a regular grid, measured as a site is (``policies.grid``)."""
    samples = [(t, sum(p)) for t, p, _, _ in list(nvml.samples) if t0 <= t <= t1]
    times = np.array([t for t, _ in samples])
    grid_t = np.arange(times[0], times[-1], SERIES_DT_S)
    power = np.interp(grid_t, times, np.array([w for _, w in samples]))
    limit = RAMP_W_PER_S_PER_GPU * node.gpus
    stats = ramp_stats(power, SERIES_DT_S, WINDOW_S, limit, limit)
    return {
        "ramp_limit_w_per_s": limit,
        "ramp_up_max_w_per_s": round(stats.up_max_w_per_s, 1),
        "ramp_down_max_w_per_s": round(stats.down_max_w_per_s, 1),
        "s_outside_ramp_up": round(stats.s_up_over, 2),
        "s_outside_ramp_down": round(stats.s_down_over, 2),
        "energy_j": round(float(power.sum()) * SERIES_DT_S, 1),
        "mean_w": round(float(power.mean()), 1),
        "seconds": round(float(grid_t[-1] - grid_t[0]), 1),
    }


def _range(targets: list[dict[int, float]]) -> list[float] | None:
    values = [w for t in targets for w in t.values()]
    return [round(min(values), 1), round(max(values), 1)] if values else None


def _lines(path: Path, level: str) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text(errors="replace").splitlines() if level in line][:5]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulate", metavar="SPEC", help="simulated GPUs: the plumbing only")
    parser.add_argument("--broker", metavar="URL", help="a running broker (default: embedded)")
    parser.add_argument("--only", choices=("off", "on"), help="one of the two runs")
    parser.add_argument("--quick", action="store_true", help="one 1 s step (for tests)")
    parser.add_argument(
        "--checkpoint-s",
        type=float,
        default=0.0,
        help="a checkpoint this long before the last step (default: none)",
    )
    parser.add_argument(
        "--rise-first",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the checkpoint, fill back up before computing (default: yes)",
    )
    parser.add_argument("--json", type=Path, help="write the result here too")
    parser.add_argument("--trace", type=Path, help="real GPUs: NAME_off.csv and NAME_on.csv")
    args = parser.parse_args(argv)
    if not 0.0 <= args.checkpoint_s <= 600.0:
        parser.error(f"--checkpoint-s must be 0 to 600 s, not {args.checkpoint_s:g}")
    if args.simulate is None and os.geteuid() != 0:
        print("bench_smooth_loop: NVML lets only root set limits; run as root or --simulate")
        return 1
    node = open_node(args.simulate)
    result: dict[str, Any] = {
        "command": "python -m bench.bench_smooth_loop "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "gpus": f"{node.gpus}x{node.model}" + (" (simulated)" if args.simulate else " (NVML)"),
        "rhythm": QUICK if args.quick else RHYTHM,
        "checkpoint_s": args.checkpoint_s,
        "rise_first": args.rise_first,
    }
    try:
        for smoothing in (False, True):
            if args.only and args.only != ("on" if smoothing else "off"):
                continue
            result["on" if smoothing else "off"] = one_run(args, node, smoothing)
    finally:
        result["put_back_errors"] = put_back(node)
    report(result, args.json)
    runs = [result[k] for k in ("off", "on") if k in result]
    return 0 if not result["put_back_errors"] and not any("error" in r for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
