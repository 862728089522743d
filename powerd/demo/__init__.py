"""`powerd demo`: the whole loop on one machine, no servers.

An embedded MQTT broker (amqtt), the cluster controller, one node agent per
node of ``powerd/data/budgets/demo.toml`` (2 rows × 4 racks × 8 nodes × 4
simulated H100) and two synthetic synchronous LLM training jobs that announce
their phases (start, compute, exposed communication, checkpoint, stop) through
``powerd.jobhook``, under budgets tight enough that the controller must cap.

- ``scenario``: the jobs and their phase scripts;
- ``runner``: puts it together and records the ground truth;
- ``summary``: what the recording adds up to (pure, tested on handmade data);
- ``view``: the live terminal view and the printed summary;
- ``plot``: the PNG of power against budget and limit over time.
"""

from powerd.demo.runner import DemoOptions, DemoRun, LiveState, run_demo
from powerd.demo.scenario import MIN_DURATION_S
from powerd.demo.summary import RunRecord, Summary, summarize

__all__ = [
    "MIN_DURATION_S",
    "DemoOptions",
    "DemoRun",
    "LiveState",
    "RunRecord",
    "Summary",
    "run_demo",
    "summarize",
]
