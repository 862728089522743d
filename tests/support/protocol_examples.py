"""The protocol's message classes and the examples docs/PROTOCOL.md gives of them."""

from __future__ import annotations

from powerd.protocol import Ack, Command, Heartbeat, PhaseEvent, Status, Telemetry

# The examples of docs/PROTOCOL.md, verbatim, in the order the page shows them.
EXAMPLES: dict[type, str] = {
    Telemetry: """{"v":1,"node":"r01-n03","ts":1795320426.28,"seq":812,"mode":"controlled",
 "gpus":[{"index":0,"uuid":"GPU-8f1c...","power_w":612.4,"energy_j":918273.5,
          "cap_w":650.0,"cap_min_w":200.0,"cap_max_w":700.0,
          "sm_clock_mhz":1755,"max_sm_clock_mhz":null,
          "util_pct":97.0,"temp_c":61.0}]}""",
    Command: """{"v":1,"epoch":7,"seq":1203,"ts":1795320426.40,"ttl_s":30,
 "gpus":[{"index":0,"cap_w":550.0,"max_sm_clock_mhz":1410}]}""",
    Ack: """{"v":1,"node":"r01-n03","epoch":7,"seq":1203,"ts":1795320426.43,
 "result":"applied",
 "gpus":[{"index":0,"cap_w":550.0,"max_sm_clock_mhz":1410,"clamped":false}],
 "errors":[]}""",
    Status: """{"v":1,"node":"r01-n03","state":"online","ts":1795320400.0,
 "gpus":4,"agent_version":"0.1.0"}""",
    PhaseEvent: """{"v":1,"job":"llama-70b-pretrain","ts":1795320426.0,"phase":"checkpoint",
 "nodes":["r01-n03","r01-n04"],"priority":"high","expected_s":45}""",
    Heartbeat: """{"v":1,"epoch":7,"ts":1795320426.0,"controller":"ctl-a","state":"leader","seq":1203}""",
}
# The message classes, in that order.
CLASSES = tuple(EXAMPLES)
# The name each example carries that must match its topic, where it has one.
TOPIC_NAME: dict[type, tuple[str, str]] = {
    Telemetry: ("node", "r01-n03"),
    Ack: ("node", "r01-n03"),
    Status: ("node", "r01-n03"),
    PhaseEvent: ("job", "llama-70b-pretrain"),
}
# The field whose name must match the topic's, for the classes that have one.
NAME_FIELD: dict[type, str] = {cls: field for cls, (field, _) in TOPIC_NAME.items()}
