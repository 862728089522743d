"""The yardstick for the controller's telemetry path: a bare paho subscriber.

It subscribes to every node's telemetry (QoS 0, as the controller does),
decodes each payload with msgspec into a plain struct of the same shape (no
validation beyond the types) and does nothing else. ``paho``'s own loop
(``loop_forever``) drives it, as a bare subscriber would be written. After
``--warmup-s`` it counts messages and its own CPU time for ``--seconds``,
then prints (or writes) one JSON object:
``{"messages": N, "cpu_s": C, "us_per_message": ...}``.

    python -m bench.bare_subscriber --port 1883 --cluster default --seconds 30
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import msgspec
import paho.mqtt.client as mqtt


class GpuSample(msgspec.Struct):
    index: int
    uuid: str
    power_w: float
    energy_j: float | None
    cap_w: float
    cap_min_w: float
    cap_max_w: float
    sm_clock_mhz: int
    max_sm_clock_mhz: int | None
    util_pct: float
    temp_c: float
    power_reading: str | None = None


class Sample(msgspec.Struct):
    v: int
    node: str
    ts: float
    seq: int
    mode: str
    gpus: list[GpuSample]
    epoch: int | None = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--cluster", default="default")
    parser.add_argument(
        "--username", help="broker login; the password from $POWERD_MQTT_PASSWORD, as powerd's"
    )
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    decoder = msgspec.json.Decoder(Sample)
    count = [0]

    def on_message(_c: mqtt.Client, _u: object, message: mqtt.MQTTMessage) -> None:
        decoder.decode(message.payload)
        count[0] += 1

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-bare-subscriber")
    client.on_message = on_message
    if args.username:
        client.username_pw_set(args.username, os.environ.get("POWERD_MQTT_PASSWORD", ""))
    client.connect(args.host, args.port, 30)
    client.subscribe(f"powerd/v1/{args.cluster}/nodes/+/telemetry", qos=0)
    result: dict[str, float] = {}

    def measure() -> None:
        time.sleep(args.warmup_s)
        cpu0, n0 = time.process_time(), count[0]
        time.sleep(args.seconds)
        cpu, n = time.process_time() - cpu0, count[0] - n0
        result.update(
            messages=n,
            seconds=args.seconds,
            cpu_s=round(cpu, 3),
            us_per_message=round(cpu / max(n, 1) * 1e6, 2),
        )
        client.disconnect()

    threading.Thread(target=measure, daemon=True).start()
    client.loop_forever()
    text = json.dumps(result)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
