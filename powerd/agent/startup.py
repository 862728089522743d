"""The agent process: open the GPUs, run the daemon until SIGTERM or SIGINT, close the GPUs.

What ``powerd agent`` runs once its config is loaded; the daemon itself
(``powerd.agent.daemon``) applies the failsafe caps before connecting anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from powerd import __version__
from powerd.agent.config import AgentConfig
from powerd.gpu import GpuError
from powerd.metrics.serving import Endpoint, serving

log = logging.getLogger("powerd")


async def run_agent(config: AgentConfig) -> None:
    """Open the GPUs, run the daemon until SIGTERM/SIGINT, close the GPUs.

    Raises GpuError when there is no GPU to manage (or NVML fails), ValueError
    on a bad ``simulate`` spec.
    """
    from powerd.agent.daemon import AgentDaemon
    from powerd.gpu.open import close_gpus, open_gpus

    verifier = config.verifier()  # a key that cannot be used stops us before any GPU is touched
    gpus = open_gpus(config.simulate, config.gpu_indices)
    if not gpus:
        raise GpuError("no GPUs to manage (check agent.gpu_indices and the driver)")
    log.info(
        "powerd agent %s: node %s, cluster %s, %d GPU(s) (%s), broker %s, mode %s",
        __version__,
        config.node,
        config.cluster,
        len(gpus),
        gpus[0].name,
        config.broker.display,
        config.mode,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    daemon = AgentDaemon(config, gpus, verifier=verifier)

    def start_metrics(listen: str) -> Endpoint | None:
        from powerd.metrics.agent import AgentCollector
        from powerd.metrics.server import serve

        return serve(AgentCollector(daemon.metrics_reading), listen, "agent")

    try:
        with serving(config.metrics_listen, start_metrics):
            await daemon.run(stop)
    finally:
        close_gpus(gpus)


def start_agent(config: AgentConfig) -> None:
    """Run the agent to the end on a new event loop (``run_agent``)."""
    asyncio.run(run_agent(config))
