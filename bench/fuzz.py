"""Fuzzing: generated payloads through the decision cores and the config parsers (issue 12).

In one process, no broker: the real ``AgentCore`` (on simulated GPUs and a manual
clock), the real ``ControllerCore`` (on a shipped budgets tree) and the three
config parsers are fed ``--payloads`` generated inputs, spread over the targets:

=====================  ======  ==================================================
target                 share   what takes the payload
=====================  ======  ==================================================
agent.command           40 %   ``AgentCore.on_command``, signed with a key the
agent.heartbeat         10 %   core trusts; ``on_heartbeat``, interleaved
controller.telemetry    14 %   ``ControllerCore.on_telemetry``  } interleaved,
controller.ack           8 %   ``ControllerCore.on_ack``        } a ``cycle()``
controller.status        5 %   ``ControllerCore.on_status``     } every ~6
controller.phase         8 %   ``ControllerCore.on_phase``      } messages
config.agent             5 %   ``powerd.agent.config.load_config`` (a file)
config.controller        5 %   ``powerd.controller.config.load_controller_config``
config.budgets           5 %   ``powerd.topology.parse_budgets``
=====================  ======  ==================================================

Generators, per message kind: random bytes; random JSON values; the message's
structure with wild values (numbers as text: ``1e999``, ``NaN``, ``2^63``,
400-digit integers; wrong types, missing, extra and repeated members, duplicate
and out-of-range GPU indices, unicode names), unsigned, signed by a stranger's key
or by the trusted key; mutations of validly signed payloads (bit flips,
truncation, members inserted after the signature, another topic's signature,
a forged key or signature); validly signed messages with wild but schema-valid
values (caps of 5e-324 W and 1.8e308 W, clocks, ttl extremes, epochs and seqs at
2^63 - 1, stale and replayed orders), so the ordering and clamping behind the
signature check run, not only the rejection. Config texts: random TOML in the
known sections; the shipped examples (``powerd/data/*.example.toml``,
``powerd/data/budgets/*.toml``) with lines deleted, duplicated, uncommented,
swapped, numbers set to extremes, values of another type, name templates with
wide format specs, units and models changed.

Invariants, after every payload (a violation is counted, its input kept):

- no exception escapes a core; ``on_command`` returns an ``Ack`` that
  ``protocol.encode`` takes, ``on_heartbeat`` returns None;
- every GPU's enforced cap within its [min, max], a clock lock within the
  device's clock range; in failsafe every GPU at its failsafe cap, unlocked;
- nothing the harness did not sign is acted on (an accepted command or
  heartbeat has a body the trusted key signed for that topic);
- commands are applied only in ``(epoch, seq)`` order and not below the newest
  epoch (a model of the agent's order state, fed with what it accepted); a
  ``stale`` ack only where the model says so; an applied cap is the requested
  one clamped into the device range, and says ``clamped`` when it was;
- the controller's commands go only to nodes of the tree, for its GPUs, with
  caps finite and within the tree's [cap_min_w, cap_max_w], and encode; the
  decision's caps are finite and in range; a phase announcement is taken only
  from the job's first announcer (the topic's owner level) and within that
  owner's priority allowance;
- a config parser returns its config or raises its own error (``ConfigError``,
  ``BudgetError``), nothing else (an offending text is also shrunk: lines
  removed while the same exception still escapes). Parse time is measured, the
  slowest per parser reported with its input (never a failure).

Counts per target: sent, rejected (failed validation: not signed by a trusted
key, not the protocol, not a node of the tree, a phase its topic may not
announce, a config error), accepted (the rest: acted on, or refused for the
core's state: stale, no live controller),
violations. Deterministic for a given ``--seed``: the signing keys derive from
it. Exits 1 if any invariant was violated.

    python -m bench.fuzz [--payloads 100000] [--seed 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime
import difflib
import hashlib
import json
import logging
import math
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, get_args

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from msgspec import UNSET

from bench.common import machine, report
from policies import PolicySettings
from powerd.agent.config import FailsafeConfig, load_config
from powerd.agent.core import AgentCore
from powerd.configfile import ConfigError
from powerd.controller.config import load_controller_config
from powerd.controller.core import ControllerCore, ControllerSettings, CycleResult
from powerd.gpu.simulated import SimulatedGpu, open_simulated
from powerd.protocol import (
    INT64_MAX,
    Ack,
    AckError,
    Command,
    GpuAck,
    GpuCommand,
    GpuTelemetry,
    Heartbeat,
    PhaseEvent,
    ProtocolError,
    Status,
    Telemetry,
    Topics,
    decode,
    detach_signature,
    encode,
)
from powerd.signing import Signer, Verifier
from powerd.topology import BudgetError, Topology, parse_budgets
from powerd.vocabulary import (
    PHASES,
    PRIORITIES,
    AckResult,
    ControllerState,
    Mode,
    NodeState,
)

SHARES: dict[str, float] = {
    "agent.command": 0.40,
    "agent.heartbeat": 0.10,
    "controller.telemetry": 0.14,
    "controller.ack": 0.08,
    "controller.status": 0.05,
    "controller.phase": 0.08,
    "config.agent": 0.05,
    "config.controller": 0.05,
    "config.budgets": 0.05,
}
TARGETS = tuple(SHARES)
AGENT_TARGETS = ("agent.command", "agent.heartbeat")
CONTROLLER_TARGETS = (
    "controller.telemetry",
    "controller.ack",
    "controller.status",
    "controller.phase",
)
CONFIG_TARGETS = ("config.agent", "config.controller", "config.budgets")

MAX_EXAMPLES = 5  # offending inputs kept per target
REPR_CHARS = 400  # of each, repr-truncated
SLOW_PARSE_S = 1.0  # a parse slower than this is counted (and reported, never a failure)
AGENT_REBUILD_EVERY = 500  # agent payloads per core: a fresh core, a fresh order state
STUCK_STEPS = 20  # agent payloads after its order state reached 2^40, before a fresh core
CONTROLLER_REBUILD_EVERY = 1000  # controller messages per core
CYCLE_EVERY = 6  # controller messages per cycle(), on average
CAP_TOLERANCE_W = 0.0006  # the simulated GPUs keep limits in mW
NODE = "r01-n03"
CLUSTER = "fuzz"
TOPICS = Topics(CLUSTER)
COMMAND_TOPIC = TOPICS.command(NODE)
DATA = resources.files("powerd") / "data"

MODES: tuple[str, ...] = get_args(Mode)
NODE_STATES: tuple[str, ...] = get_args(NodeState)
ACK_RESULTS: tuple[str, ...] = get_args(AckResult)
CONTROLLER_STATES: tuple[str, ...] = get_args(ControllerState)


# --- counting -----------------------------------------------------------------------------


@dataclass
class Tally:
    """What one target was sent and what came of it."""

    sent: int = 0
    accepted: int = 0
    rejected: int = 0
    violations: int = 0
    seconds: float = 0.0
    generators: Counter[str] = field(default_factory=Counter)
    accepted_by_generator: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    problems: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, str]] = field(default_factory=list)
    slowest_s: float = 0.0
    slowest_input: str = ""
    slow: int = 0  # parses over SLOW_PARSE_S

    def took(self, generator: str, accepted: bool, outcome: str) -> None:
        self.sent += 1
        self.generators[generator] += 1
        self.outcomes[outcome] += 1
        if accepted:
            self.accepted += 1
            self.accepted_by_generator[generator] += 1
        else:
            self.rejected += 1

    @property
    def wants_examples(self) -> bool:
        return len(self.examples) < MAX_EXAMPLES

    def violate(
        self,
        generator: str,
        payload: object,
        problem: str,
        shown: str | None = None,
        minimal: str | None = None,
    ) -> None:
        """Count a violation; keep the first few inputs (``shown``: how to show it, when its
        repr would not say much, such as a diff; ``minimal``: a smaller input that fails)."""
        self.violations += 1
        parts = problem.split(":")  # "exception: OverflowError: ...": by exception type
        self.problems[":".join(parts[:2] if parts[0] == "exception" else parts[:1])[:120]] += 1
        if self.wants_examples:
            example = {"generator": generator, "problem": problem[:500]}
            example["input"] = shown if shown is not None else _short(payload)
            if minimal is not None:
                example["minimal_input"] = _short(minimal)
            self.examples.append(example)

    def timed(self, seconds: float, payload: object, shown: str | None = None) -> None:
        if seconds > self.slowest_s:
            self.slowest_s = seconds
            self.slowest_input = shown if shown is not None else _short(payload)
        if seconds > SLOW_PARSE_S:
            self.slow += 1

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sent": self.sent,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "violations": self.violations,
            "seconds": round(self.seconds, 3),
            "per_s": round(self.sent / self.seconds) if self.seconds > 0 else None,
            "generators": {
                g: {"sent": n, "accepted": self.accepted_by_generator[g]}
                for g, n in sorted(self.generators.items())
            },
            "outcomes": dict(sorted(self.outcomes.items())),
            "problems": dict(self.problems.most_common()),
            "examples": self.examples,
        }
        if self.slowest_input:
            out["slowest_s"] = round(self.slowest_s, 4)
            out["slowest_input"] = self.slowest_input
            out[f"slower_than_{SLOW_PARSE_S:g}_s"] = self.slow
        return out


def _short(payload: object) -> str:
    text = repr(payload)
    return text if len(text) <= REPR_CHARS else text[: REPR_CHARS - 20] + f"... ({len(text)} chars)"


def split(total: int, names: Sequence[str]) -> dict[str, int]:
    """``total`` spread over ``names`` by their SHARES (renormalised), adding up exactly;
    every target gets at least one when there are enough."""
    weights = [SHARES[n] for n in names]
    scale = total / sum(weights)
    counts = {n: math.floor(w * scale) for n, w in zip(names, weights, strict=True)}
    by_rest = sorted(names, key=lambda n: SHARES[n] * scale - counts[n], reverse=True)
    for n in by_rest[: total - sum(counts.values())]:
        counts[n] += 1
    if total >= len(names):
        for n in names:
            while counts[n] == 0:
                donor = max(counts, key=lambda k: counts[k])
                counts[donor] -= 1
                counts[n] += 1
    return counts


def fixed_signer(seed: int, who: str) -> Signer:
    """An Ed25519 key derived from the seed: the run repeats byte for byte."""
    raw = hashlib.sha256(f"powerd-fuzz/{seed}/{who}".encode()).digest()
    return Signer(Ed25519PrivateKey.from_private_bytes(raw), source=f"<fuzz {who}>")


def signature_of(topic: str, payload: bytes) -> tuple[str, bytes, bytes]:
    """(topic, signed body, signature bytes) of a signed payload: the signature decoded, so
    its other base64 spellings (the last character's 4 spare bits) count as the same."""
    parts = detach_signature(payload)
    if parts is None:
        return topic, payload, b""
    body, _key, sig = parts
    return topic, body, base64.urlsafe_b64decode(sig + "==")


class Clock:
    """Monotonic and wall time that move together, only when told."""

    def __init__(self, t: float = 5_000.0, wall: float = 1_795_320_000.0) -> None:
        self.t, self.wall = t, wall

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.wall += seconds


# --- building payloads ------------------------------------------------------------------


def words(text: str) -> list[str]:
    """The words of ``text``: a long list of short tokens, written compactly."""
    return text.split()


class Raw(str):
    """Text put into a JSON payload as it is: ``1e999``, ``NaN``, a bare word."""


class Obj(list[tuple[str, Any]]):
    """A JSON object as (key, value) pairs: a key may come twice."""

    def get(self, key: str) -> Any:
        return next((v for k, v in self if k == key), None)

    def set(self, key: str, value: Any) -> None:
        for i, (k, _) in enumerate(self):
            if k == key:
                self[i] = (key, value)
                return
        self.append((key, value))


def dump(value: Any) -> str:
    """JSON text of ``value``, with ``Raw`` tokens as they are and ``Obj`` keys repeated."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Obj):
        return "{" + ",".join(f"{json.dumps(k)}:{dump(v)}" for k, v in value) + "}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


WILD_NUMBERS = [
    *words("0 -0 -1 1 0.5 1e308 -1e308 1.7976931348623157e308 1e309 1e999 -1e999 5e-324"),
    *words("1e-400 NaN Infinity -Infinity nan inf 1e18 0x10 01 +1 .5 1. 1e --1 1_000"),
    *words("9223372036854775807 9223372036854775808 -9223372036854775809"),
    "18446744073709551616",
    "1" + "0" * 400,
]
WILD_VALUES: list[Any] = ["12", "", "名前", "\u0000", "\ud800", "a" * 70, True, False, None]
WILD_VALUES += [[], {}, [1, 2], {"a": 1}, [None]]
WILD_NAMES = ["", "-x", ".x", "a" * 64, "a" * 65, "名前", "n\n", "a/b", "+", "#", "x\u200b", "ü"]
WILD_NAMES += ["a b", "\ud800", "r01-n03\x00"]
KEY_POOL = [
    *words("v epoch seq ts ttl_s gpus index cap_w max_sm_clock_mhz node controller state"),
    *words("mode result errors phase job nodes priority key sig power_w x 名"),
    "",
]
BIG_INTS = [0, 1, 2, 3600, 2**31, 2**53 + 1, 2**62, INT64_MAX - 1, INT64_MAX]


class Draw:
    """Random inputs of every kind, from one ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, options: Sequence[Any]) -> Any:
        return options[self.rng.randrange(len(options))]

    def weighted(self, options: dict[str, float]) -> str:
        return self.rng.choices(list(options), weights=list(options.values()))[0]

    def raw_bytes(self) -> bytes:
        n = self.pick([0, 1, 2, 8, 32, 100, 300, 1000, 4000])
        if self.chance(0.01):
            n = 65 * 1024 + self.rng.randrange(100)  # over the protocol's 64 KiB
        body = self.rng.randbytes(n)
        return self.pick([b"", b"{", b'{"v":1,', b"["]) + body

    def scalar(self) -> Any:
        r = self.rng.random()
        if r < 0.3:
            return Raw(self.pick(WILD_NUMBERS))
        if r < 0.5:
            return self.pick(WILD_VALUES)
        if r < 0.65:
            return self.rng.uniform(-1e6, 1e6)
        if r < 0.8:
            return self.pick(BIG_INTS) * self.pick([1, -1])
        return self.text()

    def text(self) -> str:
        n = self.pick([0, 1, 5, 20, 64, 65, 300])
        alphabet = self.pick(
            [
                "abcdefghijklmnopqrstuvwxyz0123456789-._",
                "ÄéüÅ名前ไทย🙂\u200b\u202e",
                "\x00\x01\n\t\"\\'/{}[]:,",
            ]
        )
        return "".join(self.pick(alphabet) for _ in range(n))

    def json_value(self, depth: int = 0) -> Any:
        r = self.rng.random()
        if depth >= 3 or r < 0.45:
            return self.scalar()
        if r < 0.7:
            return [self.json_value(depth + 1) for _ in range(self.rng.randrange(6))]
        return Obj(
            (self.pick(KEY_POOL) if self.chance(0.8) else self.text(), self.json_value(depth + 1))
            for _ in range(self.rng.randrange(7))
        )

    def random_json(self) -> bytes:
        value = self.json_value() if self.chance(0.6) else self.json_value(2)
        text = dump(value)
        if self.chance(0.1):
            text = " " * self.rng.randrange(4) + text + self.pick(["", "\n", " ", "}", ",", "\x00"])
        return text.encode("utf-8", "surrogatepass")

    def wild(self) -> Any:
        """A value for any member: a wild number, a wrong type, random JSON."""
        r = self.rng.random()
        if r < 0.45:
            return Raw(self.pick(WILD_NUMBERS))
        if r < 0.7:
            return self.pick(WILD_VALUES)
        if r < 0.85:
            return self.pick(WILD_NAMES)
        return self.json_value(1)

    def mess_up(self, obj: Obj, gpu_fields: Sequence[str] = ()) -> Obj:
        """1 to 3 edits: a member replaced by a wild value, removed, added, repeated; for a
        message with ``gpus``: its entries too (duplicates, out of range, wrong types)."""
        obj = Obj(obj)
        for _ in range(self.rng.randint(1, 3)):
            kind = self.weighted(
                {"replace": 4, "drop": 1.5, "extra": 1, "repeat": 1, "gpus": 3 if gpu_fields else 0}
            )
            if kind == "replace" and obj:
                i = self.rng.randrange(len(obj))
                obj[i] = (obj[i][0], self.wild())
            elif kind == "drop" and obj:
                del obj[self.rng.randrange(len(obj))]
            elif kind == "extra":
                obj.insert(self.rng.randrange(len(obj) + 1), (self.pick(KEY_POOL), self.wild()))
            elif kind == "repeat" and obj:
                key = self.pick(obj)[0]
                obj.insert(self.rng.randrange(len(obj) + 1), (key, self.wild()))
            elif kind == "gpus":
                obj.set("gpus", self.mess_up_gpus(obj.get("gpus"), gpu_fields))
        return obj

    def mess_up_gpus(self, gpus: Any, gpu_fields: Sequence[str]) -> Any:
        entries = list(gpus) if isinstance(gpus, list) else []
        kind = self.pick(["empty", "many", "dup", "range", "entry", "field", "type"])
        if kind == "empty":
            return []
        if kind == "many":
            n = self.pick([33, 100, 1024, 1025, 3000])
            return [Obj([("index", i % 1100), ("cap_w", 300.0)]) for i in range(n)]
        if kind == "type":
            return self.wild()
        if not entries:
            entries = [Obj([("index", 0)])]
        i = self.rng.randrange(len(entries))
        entry = Obj(entries[i]) if isinstance(entries[i], Obj) else Obj([("index", 0)])
        if kind == "dup":
            entries.append(Obj(entry))
        elif kind == "range":
            entry.set(
                "index", Raw(self.pick(["1023", "1024", "-1", "4", "9", "2e0", "1.5", "1e999"]))
            )
            entries[i] = entry
        elif kind == "entry":
            entries[i] = self.wild()
        else:
            entry.set(self.pick(list(gpu_fields)), self.wild())
            entries[i] = entry
        return entries

    def mutate_bytes(self, payload: bytes) -> tuple[str, bytes]:
        """A signed payload, changed: the signature must no longer hold (or hold the same body)."""
        kind = self.pick(
            ["bitflip", "truncate", "after_sig", "before_sig", "digit", "trailing", "escape"]
        )
        data = bytearray(payload)
        if kind == "bitflip":
            for _ in range(self.rng.randint(1, 3)):
                data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
        elif kind == "truncate":
            del data[self.rng.randrange(len(data)) :]
        elif kind == "after_sig":  # a member after the signature: no longer the last two
            member = self.pick([b'"cap_w":1e308', b'"epoch":9223372036854775807', b'"x":1'])
            data = data[:-1] + b"," + member + b"}"
        elif kind == "before_sig":  # a member inside the signed body: the body changes
            at = payload.rfind(b',"key":')
            data = data[:at] + b',"ttl_s":86400' + data[at:]
        elif kind == "digit":
            digits = [i for i, c in enumerate(data) if 48 <= c <= 57]
            if digits:
                i = self.pick(digits)
                data[i] = 48 + (data[i] - 48 + self.rng.randint(1, 9)) % 10
        elif kind == "trailing":
            data += self.pick([b"\n", b" ", b"\x00", b"}"])
        else:  # a character of the body written as a \u escape: the same JSON, other bytes
            quoted = [i for i, c in enumerate(payload[: payload.rfind(b',"key":')]) if c == 34]
            if len(quoted) > 1:
                i = self.pick(quoted[:-1]) + 1
                if 32 < data[i] < 127 and data[i] != 92:
                    data[i : i + 1] = b"\\u%04x" % data[i]
        return kind, bytes(data)


# --- the agent ----------------------------------------------------------------------------

AGENT_COMMAND_GENERATORS = {
    "random_bytes": 1.0,
    "random_json": 1.0,
    "wild_struct/unsigned": 1.0,
    "wild_struct/stranger": 0.5,
    "wild_struct/signed": 2.0,
    "mutated_signed": 2.0,
    "signed_valid_wild": 5.0,
}
AGENT_HEARTBEAT_GENERATORS = {
    "random_bytes": 0.5,
    "random_json": 0.5,
    "wild_struct/unsigned": 0.5,
    "wild_struct/stranger": 0.3,
    "wild_struct/signed": 1.0,
    "mutated_signed": 1.0,
    "signed_valid_wild": 1.5,
    "live": 6.0,
}
GPU_SPECS = ["4xH100", "8xGB200", "2xA100", "1xH100", "8xH100", "3xV100"]


@dataclass
class OrderModel:
    """What the agent's order state must be, from what it accepted: newest epoch, last applied."""

    newest_epoch: int = -1
    last_applied: tuple[int, int] = (-1, -1)


class AgentFuzz:
    """One agent core at a time, fed commands and heartbeats in a shuffled order."""

    def __init__(
        self,
        draw: Draw,
        tallies: dict[str, Tally],
        signer: Signer,
        stranger: Signer,
        core_class: type[AgentCore] = AgentCore,
    ) -> None:
        self.draw, self.tallies = draw, tallies
        self.signer, self.stranger = signer, stranger
        self.verifier = Verifier([signer.trusted()])
        self.core_class = core_class
        # (topic, body, signature) of everything the trusted key signed, and the payloads
        self.signed: set[tuple[str, bytes, bytes]] = set()
        self.signed_payloads: set[bytes] = set()
        self.rebuilds = 0
        self.build()

    def build(self) -> None:
        d = self.draw
        self.clock = Clock()
        self.gpus: list[SimulatedGpu] = open_simulated(
            d.pick(GPU_SPECS), clock=self.clock.monotonic, seed=self.rebuilds
        )
        failsafe = FailsafeConfig(
            cap_w=d.pick([None, 1.0, 350.0, 500.0, 5000.0]),
            caps_w=d.pick([{}, {}, {0: 150.0}, {1: 5000.0, 7: 1.0}]),
            fraction=d.pick([0.05, 0.8, 1.0]),
        )
        self.core = self.core_class(
            NODE,
            self.gpus,
            failsafe,
            d.pick([2.0, 10.0, 10.0, 60.0]),  # failsafe_after_s
            verifier=self.verifier,
            cluster=CLUSTER,
            max_command_ttl_s=d.pick([1.0, 120.0, 120.0, 86_400.0]),
            monotonic=self.clock.monotonic,
            wall=self.clock.time,
        )
        self.core.start()
        self.model = OrderModel()
        self.next_seq = 1
        self.stuck = 0
        self.rebuilds += 1

    def sign(self, topic: str, body: bytes, signer: Signer | None = None) -> bytes:
        """``body`` signed for ``topic`` (by the trusted key unless told), recorded."""
        signer = signer or self.signer
        try:
            payload = signer.sign(topic, body)
        except ProtocolError:  # not a JSON object: sent unsigned
            return body
        if signer is self.signer:
            self.signed.add(signature_of(topic, payload))
            self.signed_payloads.add(payload)
        return payload

    # --- commands ---

    def current_epoch(self) -> int:
        return max(self.model.newest_epoch, 1)

    def order(self) -> tuple[int, int]:
        """An (epoch, seq) for a signed command: mostly the next in order, sometimes not."""
        d, epoch = self.draw, self.current_epoch()
        kind = d.weighted({"next": 6, "jump": 1, "replay": 1, "older": 1, "extreme": 1, "any": 1})
        if kind == "next":
            self.next_seq = max(self.next_seq, self.model.last_applied[1] + 1)
            seq = self.next_seq
            self.next_seq += 1
            return epoch, min(seq, INT64_MAX)
        if kind == "jump":
            return min(epoch + d.pick([0, 1, 2, 1000]), INT64_MAX), d.rng.randrange(INT64_MAX)
        if kind == "replay":
            last = self.model.last_applied  # (epoch, -1): a floor, no command applied yet
            return last if min(last) >= 0 else (epoch, 0)
        if kind == "older":
            return max(0, epoch - d.pick([1, 2])), min(self.next_seq + 5, INT64_MAX)
        if kind == "extreme":
            return d.pick(BIG_INTS), d.pick(BIG_INTS)
        return d.rng.randrange(INT64_MAX + 1), d.rng.randrange(INT64_MAX + 1)

    def valid_command(self, wild: bool) -> Command:
        d = self.draw
        gpu0 = self.gpus[0]
        lim, clk = gpu0.power_limit_range(), gpu0.sm_clock_range()
        n = len(self.gpus)
        shape = (
            d.weighted({"some": 8, "none": 0.5, "outside": 1, "all_1024": 0.3}) if wild else "some"
        )
        if shape == "none":
            indices: list[int] = []
        elif shape == "all_1024":
            indices = list(range(1024))
        else:
            indices = d.rng.sample(range(n), d.rng.randint(1, n))
            if shape == "outside":
                indices.append(d.rng.randrange(n, 1024))
        gpus = []
        for i in indices:
            entry = GpuCommand(index=i)
            if not wild or d.chance(0.85):
                entry.cap_w = (
                    d.pick(
                        [
                            5e-324,
                            1e-9,
                            0.5,
                            lim.min_w - 1,
                            lim.min_w,
                            lim.min_w + 0.0004,
                            (lim.min_w + lim.max_w) / 2,
                            lim.max_w,
                            lim.max_w + 1,
                            1e6,
                            1e308,
                            1.7976931348623157e308,
                        ]
                    )
                    if wild
                    else d.rng.uniform(lim.min_w, lim.max_w)
                )
            if wild and d.chance(0.6):
                entry.max_sm_clock_mhz = d.pick(
                    [
                        None,
                        5e-324,
                        0.4,
                        0.5,
                        1.0,
                        clk.min_mhz - 1,
                        clk.min_mhz,
                        (clk.min_mhz + clk.max_mhz) / 2 + 0.5,
                        clk.max_mhz,
                        clk.max_mhz + 0.5,
                        1e5,
                        1e308,
                    ]
                )
            gpus.append(entry)
        epoch, seq = self.order() if wild else (self.current_epoch(), min(self.next_seq, INT64_MAX))
        ttl = 30.0
        if d.chance(0.3):  # (a short one sends the agent to failsafe: refused until a heartbeat)
            ttl = d.pick([5e-324, 1e-9, 0.001, 1.0, 120.0, 121.0, 86_399.9, 86_400.0])
        ts = d.pick([-1e308, -1.0, 0.0, self.clock.wall, self.clock.wall + 1e9, 1e308])
        return Command(
            v=1,
            epoch=epoch,
            seq=seq,
            ts=ts if wild else self.clock.wall,
            ttl_s=ttl if wild else 30.0,
            gpus=gpus,
        )

    def command_obj(self) -> Obj:
        lim = self.gpus[0].power_limit_range()
        return Obj(
            [
                ("v", 1),
                ("epoch", self.current_epoch()),
                ("seq", min(self.next_seq, INT64_MAX)),
                ("ts", self.clock.wall),
                ("ttl_s", 30.0),
                (
                    "gpus",
                    [
                        Obj([("index", g.index), ("cap_w", lim.max_w), ("max_sm_clock_mhz", None)])
                        for g in self.gpus
                    ],
                ),
            ]
        )

    def command_payload(self, generator: str) -> bytes:
        d = self.draw
        if generator == "random_bytes":
            return d.raw_bytes()
        if generator == "random_json":
            return d.random_json()
        if generator.startswith("wild_struct/"):
            obj = d.mess_up(self.command_obj(), ("index", "cap_w", "max_sm_clock_mhz"))
            body = dump(obj).encode("utf-8", "surrogatepass")
            who = generator.split("/")[1]
            if who == "unsigned":
                return body
            return self.sign(COMMAND_TOPIC, body, self.stranger if who == "stranger" else None)
        if generator == "mutated_signed":
            valid = self.sign(COMMAND_TOPIC, encode(self.valid_command(wild=False)))
            return self.mutated(valid, COMMAND_TOPIC)
        return self.sign(COMMAND_TOPIC, encode(self.valid_command(wild=True)))

    def mutated(self, valid: bytes, topic: str) -> bytes:
        d = self.draw
        if d.chance(0.2):  # signed right, but for another topic, or by the wrong key
            body = valid[: valid.rfind(b',"key":')] + b"}"
            how = d.pick(["other_topic", "stranger", "forged_sig", "stranger_key_id"])
            if how == "other_topic":
                other = d.pick(
                    [TOPICS.command("r01-n04"), TOPICS.heartbeat, COMMAND_TOPIC, TOPICS.ack(NODE)]
                )
                if other == topic:
                    other = Topics("other").command(NODE)
                return self.signer.sign(other, body)
            if how == "stranger":
                return self.stranger.sign(topic, body)
            if how == "forged_sig":
                sig = "".join(d.pick("ABCDEFabcdef0123456789-_") for _ in range(86))
                return body[:-1] + b',"key":"%s","sig":"%s"}' % (
                    self.signer.key_id.encode(),
                    sig.encode(),
                )
            forged = self.stranger.sign(topic, body)
            return forged.replace(self.stranger.key_id.encode(), self.signer.key_id.encode())
        return d.mutate_bytes(valid)[1]

    # --- heartbeats ---

    def heartbeat_obj(self) -> Obj:
        return Obj(
            [
                ("v", 1),
                ("epoch", self.current_epoch()),
                ("ts", self.clock.wall),
                ("controller", "ctl-fuzz"),
                ("state", "leader"),
            ]
        )

    def heartbeat_payload(self, generator: str) -> bytes:
        d = self.draw
        topic = TOPICS.heartbeat
        if generator == "random_bytes":
            return d.raw_bytes()
        if generator == "random_json":
            return d.random_json()
        if generator.startswith("wild_struct/"):
            body = dump(d.mess_up(self.heartbeat_obj())).encode("utf-8", "surrogatepass")
            who = generator.split("/")[1]
            if who == "unsigned":
                return body
            return self.sign(topic, body, self.stranger if who == "stranger" else None)
        if generator == "live":
            beat = Heartbeat(
                v=1,
                epoch=self.current_epoch(),
                ts=self.clock.wall - d.rng.uniform(0.0, 0.5),
                controller="ctl-fuzz",
                state="leader",
            )
            return self.sign(topic, encode(beat))
        if generator == "mutated_signed":
            beat = Heartbeat(
                v=1, epoch=self.current_epoch(), ts=self.clock.wall, controller="c", state="leader"
            )
            return self.mutated(self.sign(topic, encode(beat)), topic)
        epoch = d.pick(
            [self.current_epoch(), self.current_epoch() + 1, 0, INT64_MAX, d.rng.randrange(2**40)]
        )
        beat = Heartbeat(
            v=1,
            epoch=min(epoch, INT64_MAX),
            ts=d.pick(
                [
                    self.clock.wall,
                    self.clock.wall - 5,
                    self.clock.wall - 1e4,
                    self.clock.wall + 1e4,
                    -1e308,
                    1e308,
                    0.0,
                ]
            ),
            controller=d.pick(["ctl-fuzz", "ctl-b", "a" * 64]),
            state=d.pick(CONTROLLER_STATES),
        )
        return self.sign(topic, encode(beat))

    # --- one step ---

    def step(self, target: str) -> None:
        d, tally = self.draw, self.tallies[target]
        if self.rebuild_due():
            self.build()
        self.clock.advance(d.pick([0.0, 0.01, 0.1, 0.3, 0.5, 1.0]) if d.chance(0.99) else 15.0)
        started = time.perf_counter()
        if target == "agent.command":
            generator = d.weighted(AGENT_COMMAND_GENERATORS)
            payload = self.command_payload(generator)
            self.check_command(generator, payload, tally)
        else:
            generator = d.weighted(AGENT_HEARTBEAT_GENERATORS)
            payload = self.heartbeat_payload(generator)
            self.check_heartbeat(generator, payload, tally)
        try:
            self.core.tick()
        except Exception as exc:
            tally.violate(generator, payload, f"exception in tick: {type(exc).__name__}: {exc}")
        self.check_devices(generator, payload, tally)
        tally.seconds += time.perf_counter() - started

    def rebuild_due(self) -> bool:
        """Every AGENT_REBUILD_EVERY payloads, and a while after the order state reached the
        end of the int64 range (signed epochs and seqs near 2^63: only stale acks follow)."""
        done = sum(self.tallies[t].sent for t in AGENT_TARGETS if t in self.tallies)
        if max(self.model.newest_epoch, self.model.last_applied[1]) >= 2**40:
            self.stuck += 1
        return (done > 0 and done % AGENT_REBUILD_EVERY == 0) or self.stuck > STUCK_STEPS

    def verified(self, topic: str, payload: bytes) -> bool:
        """Whether the harness had the trusted key sign ``payload``'s body for ``topic``."""
        return signature_of(topic, payload) in self.signed

    def check_command(self, generator: str, payload: bytes, tally: Tally) -> None:
        core, model = self.core, self.model
        before = dataclasses.replace(core.counters)
        before_model = dataclasses.replace(model)
        try:
            ack = core.on_command(payload)
        except Exception as exc:
            tally.took(generator, False, "exception")
            tally.violate(generator, payload, f"exception: {type(exc).__name__}: {exc}")
            return
        if not isinstance(ack, Ack):
            tally.took(generator, False, "no ack")
            tally.violate(generator, payload, f"on_command returned {type(ack).__name__}")
            return
        after = core.counters
        unverified = after.unverified > before.unverified
        invalid = after.payloads_rejected > before.payloads_rejected
        refused = after.commands_refused > before.commands_refused
        outcome = (
            "unverified"
            if unverified
            else "invalid"
            if invalid
            else "refused"
            if refused
            else ack.result
        )
        accepted = not (unverified or invalid)
        tally.took(generator, accepted, outcome)
        try:
            encode(ack)
        except Exception as exc:
            tally.violate(generator, payload, f"ack does not encode: {type(exc).__name__}: {exc}")
        if not accepted:
            if ack.result != "rejected":
                tally.violate(generator, payload, f"a refused payload acked {ack.result!r}")
            return
        if not self.verified(COMMAND_TOPIC, payload):
            tally.violate(generator, payload, "accepted a command the trusted key did not sign")
            return
        if payload not in self.signed_payloads:
            tally.outcomes["accepted_other_encoding"] += 1  # same body, same signature bytes
        try:
            command = decode(Command, payload)
        except ProtocolError as exc:
            tally.violate(generator, payload, f"accepted an invalid command: {exc}")
            return
        order = (command.epoch, command.seq)
        in_order = command.epoch >= before_model.newest_epoch and order > before_model.last_applied
        if ack.result in ("applied", "partial"):
            if not in_order:
                tally.violate(
                    generator,
                    payload,
                    f"applied out of order: {order} after {before_model.last_applied}, "
                    f"newest epoch {before_model.newest_epoch}",
                )
            model.last_applied = order
            model.newest_epoch = max(model.newest_epoch, command.epoch)
            self.check_clamping(generator, payload, command, ack, tally)
        elif ack.result == "stale" and in_order:
            tally.violate(
                generator,
                payload,
                f"acked stale in order: {order} after {before_model.last_applied}, "
                f"newest epoch {before_model.newest_epoch}",
            )
        if (ack.epoch, ack.seq) != order:
            tally.violate(generator, payload, f"ack for {(ack.epoch, ack.seq)}, command {order}")

    def check_clamping(
        self, generator: str, payload: bytes, command: Command, ack: Ack, tally: Tally
    ) -> None:
        asked = {g.index: g for g in command.gpus}
        failed = {e.index for e in ack.errors}
        for got in ack.gpus:
            want = asked.get(got.index)
            gpu = self.core.gpus.get(got.index)
            if want is None or gpu is None or got.index in failed:
                continue
            lim, clk = gpu.power_limit_range(), gpu.sm_clock_range()
            if want.cap_w is not UNSET:
                target = min(max(want.cap_w, lim.min_w), lim.max_w)
                if got.cap_w is None or abs(got.cap_w - target) > CAP_TOLERANCE_W:
                    tally.violate(
                        generator,
                        payload,
                        f"cap not clamped: gpu {got.index} asked {want.cap_w!r} W, "
                        f"holds {got.cap_w!r} W, range [{lim.min_w}, {lim.max_w}]",
                    )
                if not lim.min_w <= want.cap_w <= lim.max_w and not got.clamped:
                    tally.violate(generator, payload, f"clamped cap not flagged: gpu {got.index}")
            if want.max_sm_clock_mhz is not UNSET:
                lock = want.max_sm_clock_mhz
                expect = (
                    None if lock is None else int(min(max(round(lock), clk.min_mhz), clk.max_mhz))
                )
                if got.max_sm_clock_mhz != expect:
                    tally.violate(
                        generator,
                        payload,
                        f"clock lock not clamped: gpu {got.index} asked {lock!r}, "
                        f"holds {got.max_sm_clock_mhz!r}, range [{clk.min_mhz}, {clk.max_mhz}]",
                    )

    def check_heartbeat(self, generator: str, payload: bytes, tally: Tally) -> None:
        core, model = self.core, self.model
        before = dataclasses.replace(core.counters)
        try:
            take: Callable[[bytes], object] = core.on_heartbeat  # returns None, we check
            returned = take(payload)
        except Exception as exc:
            tally.took(generator, False, "exception")
            tally.violate(generator, payload, f"exception: {type(exc).__name__}: {exc}")
            return
        after = core.counters
        unverified = after.unverified > before.unverified
        invalid = after.payloads_rejected > before.payloads_rejected
        ignored = (  # a standby, deposed or retained one, a replay, or one from the future
            after.heartbeats_ignored > before.heartbeats_ignored
            or after.heartbeats_replayed > before.heartbeats_replayed
            or after.clock_alarms > before.clock_alarms
        )
        accepted = not (unverified or invalid)
        outcome = "unverified" if unverified else "invalid" if invalid else "ignored"
        if accepted and not ignored:
            outcome = "live"
        tally.took(generator, accepted, outcome)
        if returned is not None:
            tally.violate(generator, payload, f"on_heartbeat returned {type(returned).__name__}")
        if not accepted:
            return
        if not self.verified(TOPICS.heartbeat, payload):
            tally.violate(generator, payload, "accepted a heartbeat the trusted key did not sign")
            return
        if payload not in self.signed_payloads:
            tally.outcomes["accepted_other_encoding"] += 1
        beat = decode(Heartbeat, payload)
        # the epoch it follows, and its order's floor (a live heartbeat's seq, a deposed
        # epoch's fresh start), are the heartbeat rules' (tests/agent): taken as the agent's
        model.newest_epoch = core.following.newest_epoch
        model.last_applied = core.last_applied
        if outcome == "live" and (beat.state != "leader" or core.mode != "controlled"):
            tally.violate(generator, payload, f"live from a {beat.state}, mode {core.mode}")

    def check_devices(self, generator: str, payload: bytes, tally: Tally) -> None:
        failsafe = self.core.mode == "failsafe"
        for index, gpu in self.core.gpus.items():
            lim, clk = gpu.power_limit_range(), gpu.sm_clock_range()
            cap, lock = gpu.enforced_cap_w(), gpu.locked_max_sm_clock_mhz()
            if not lim.min_w <= cap <= lim.max_w:
                tally.violate(
                    generator, payload, f"cap out of range: gpu {index} at {cap!r} W, {lim}"
                )
            if lock is not None and not clk.min_mhz <= lock <= clk.max_mhz:
                tally.violate(
                    generator, payload, f"clock lock out of range: gpu {index} at {lock!r}, {clk}"
                )
            failsafe_w = self.core.failsafe_caps_w[index]
            off_w = gpu.power_limit_w() - failsafe_w
            if self.core.failsafe_raise_pending:  # below it, the raise waits (enter_failsafe)
                off_w = max(off_w, 0.0)
            if failsafe and (abs(off_w) > CAP_TOLERANCE_W or lock is not None):
                tally.violate(
                    generator,
                    payload,
                    f"failsafe not held: gpu {index} at {gpu.power_limit_w()} W, lock {lock}, "
                    f"failsafe cap {self.core.failsafe_caps_w[index]} W",
                )


# --- the controller -----------------------------------------------------------------------

CONTROLLER_GENERATORS = {
    "random_bytes": 1.0,
    "random_json": 1.0,
    "wild_struct": 2.0,
    "mutated": 1.5,
    "valid_wild": 3.0,
    "valid": 3.0,
}
BUDGET_FILES = ("tiny.toml", "demo.toml")
JOB_OWNERS = {"job-a": "alice", "job-b": None, "j3": "mallory"}


@dataclass
class CycleTally:
    cycles: int = 0
    commands: int = 0
    seconds: float = 0.0
    violations: int = 0


class ControllerFuzz:
    """One controller core at a time: telemetry, acks, statuses and phases, and cycles."""

    def __init__(
        self,
        draw: Draw,
        tallies: dict[str, Tally],
        core_class: type[ControllerCore] = ControllerCore,
    ) -> None:
        self.draw, self.tallies = draw, tallies
        self.core_class = core_class
        self.topologies = [parse_budgets((DATA / "budgets" / f).read_text()) for f in BUDGET_FILES]
        self.cycles = CycleTally()
        self.owner: str | None = None  # the owner level of the phase topic, None: unowned
        self.handled = 0
        self.rebuilds = 0
        self.build()

    def build(self) -> None:
        d = self.draw
        self.topology: Topology = self.topologies[self.rebuilds % len(self.topologies)]
        self.tree = self.topology.tree
        self.nodes = list(self.tree.server_names)
        self.clock = Clock(100.0)
        # a long stale_after_s keeps the demo tree's 64 nodes live between their telemetry
        settings = ControllerSettings(
            stale_after_s=d.pick([5.0, 60.0]),
            agent_failsafe_after_s=d.pick([10.0, 120.0]),
            max_raises_per_cycle=d.pick([1, 3, 2000]),
            job_priority_max=d.pick([{}, {"mallory": "low", "bob": "normal"}]),
            default_job_priority_max=d.pick(["high", "normal"]),
            accept_unowned_jobs=d.chance(0.7),
        )
        self.core = self.core_class(
            self.tree, settings, monotonic=self.clock.monotonic, wall=self.clock.time
        )
        self.core.new_epoch(d.rng.randint(1, 1000))
        self.seq = dict.fromkeys(self.nodes, 0)
        self.sent: list[tuple[str, Command]] = []  # the last cycles' commands, for acks
        self.rebuilds += 1

    def gpus_of(self, node: str) -> range:
        return self.tree.server_gpus[self.tree.server_ordinal[node]]

    def pick_node(self) -> tuple[str, str]:
        """(the topic's node name, the name the payload carries)."""
        d = self.draw
        node = d.pick(self.nodes)
        r = d.rng.random()
        if r < 0.05:
            return "not-in-tree", "not-in-tree"
        if r < 0.09:
            return node, d.pick([n for n in self.nodes if n != node] or ["x"])
        if r < 0.12:
            name = d.pick(WILD_NAMES)
            return name, name
        return node, node

    # --- payloads ---

    def telemetry(self, node: str, topic_node: str, wild: bool) -> Telemetry:
        d = self.draw
        gpus = self.gpus_of(topic_node) if topic_node in self.tree.server_ordinal else range(4)
        entries = []
        for local, i in enumerate(gpus):
            lo = float(self.tree.cap_min_w[i]) if i < self.tree.n_gpus else 200.0
            hi = float(self.tree.cap_max_w[i]) if i < self.tree.n_gpus else 700.0
            cap = d.rng.uniform(lo, hi)
            power = d.rng.uniform(0.1 * hi, cap)
            entry = GpuTelemetry(
                index=local,
                uuid=f"GPU-{local}",
                power_w=power,
                energy_j=1e6,
                cap_w=cap,
                cap_min_w=lo,
                cap_max_w=hi,
                sm_clock_mhz=1500,
                max_sm_clock_mhz=None,
                util_pct=90.0,
                temp_c=60.0,
            )
            if wild:
                self.wild_gpu(entry)
            entries.append(entry)
        if wild and d.chance(0.2):
            extra = GpuTelemetry(
                **{f: getattr(entries[0], f) for f in GpuTelemetry.__struct_fields__}
            )
            extra.index = d.pick([0, len(entries), 1023])
            entries.append(extra)
        if wild and d.chance(0.05):
            entries = []
        self.seq[topic_node] = self.seq.get(topic_node, 0) + 1
        seq = self.seq[topic_node]
        if wild and d.chance(0.5):
            seq = d.pick([0, 1, 16, 17, seq - 1, seq, seq + 3600, seq + 3601, INT64_MAX])
            seq = max(0, seq)
        return Telemetry(
            v=1,
            node=node,
            ts=self.wild_ts() if wild and d.chance(0.3) else self.clock.wall,
            seq=seq,
            mode=d.pick(MODES) if wild else "controlled",
            gpus=entries,
            epoch=d.pick([None, 0, self.core.epoch, INT64_MAX]) if wild else self.core.epoch,
        )

    def wild_gpu(self, g: GpuTelemetry) -> None:
        d = self.draw
        for _ in range(d.rng.randint(1, 3)):
            name = d.pick(
                words(
                    "power_w cap_w cap_min_w cap_max_w sm_clock_mhz max_sm_clock_mhz util_pct "
                    "temp_c energy_j index"
                )
            )
            if name in ("power_w", "cap_w", "cap_min_w", "cap_max_w", "energy_j"):
                value: Any = d.pick([0.0, 5e-324, 1.0, 199.0, 700.0, 1201.0, 1e6, 1e308])
            elif name in ("sm_clock_mhz", "max_sm_clock_mhz"):
                value = d.pick([0, 1, 345, 1100, 2062, 100_000])
            elif name == "util_pct":
                value = d.pick([0.0, 100.0, 5e-324])
            elif name == "temp_c":
                value = d.pick([-1e308, -273.15, 0.0, 1e308])
            else:
                value = d.pick([0, 1, 3, 4, 7, 8, 1023])
            setattr(g, name, value)

    def wild_ts(self) -> float:
        return float(
            self.draw.pick([-1e308, -1.0, 0.0, self.clock.wall - 1e6, self.clock.wall + 1e6, 1e308])
        )

    def ack(self, node: str, topic_node: str, wild: bool) -> Ack:
        d = self.draw
        mine = [(n, c) for n, c in self.sent if n == topic_node]
        epoch, seq, gpus = self.core.epoch, d.rng.randint(0, 50), []
        if mine:
            _, command = d.pick(mine)
            epoch, seq = command.epoch, command.seq
            gpus = [
                GpuAck(
                    index=g.index,
                    cap_w=g.cap_w if g.cap_w is not UNSET else None,
                    max_sm_clock_mhz=(
                        None
                        if g.max_sm_clock_mhz is UNSET or g.max_sm_clock_mhz is None
                        else round(g.max_sm_clock_mhz)
                    ),
                    clamped=False,
                )
                for g in command.gpus
            ]
        result = d.pick(ACK_RESULTS) if wild else d.pick(["applied", "applied", "partial"])
        errors = [AckError(index=None, message="x")] if result in ("partial", "rejected") else []
        if wild:
            epoch = d.pick([epoch, epoch, 0, epoch + 1, INT64_MAX])
            seq = d.pick([seq, seq, 0, seq + 1, max(0, seq - 1), INT64_MAX])
            for g in gpus:
                g.cap_w = d.pick([g.cap_w, None, 0.0, 5e-324, 1e308, 199.0, 1201.0])
                g.max_sm_clock_mhz = d.pick([g.max_sm_clock_mhz, None, 0, 100_000])
                g.index = d.pick([g.index, g.index, 1023, 8])
            if d.chance(0.1):
                errors = [AckError(index=d.pick([None, 0, 1023]), message=d.text())] * d.pick(
                    [1, 40]
                )
        return Ack(
            v=1,
            node=node,
            epoch=epoch,
            seq=seq,
            ts=self.wild_ts() if wild and d.chance(0.3) else self.clock.wall,
            result=result,
            gpus=gpus,
            errors=errors,
        )

    def status(self, node: str, wild: bool) -> Status:
        d = self.draw
        return Status(
            v=1,
            node=node,
            state=d.pick(NODE_STATES) if wild else d.pick(["online", "online", "failsafe"]),
            ts=self.wild_ts() if wild else self.clock.wall,
            gpus=d.pick([0, 4, 1024, INT64_MAX]) if wild else 4,
            agent_version=d.text() if wild else "0.1.0",
            failsafe_cap_w=(
                d.pick([None, 0.0, 5e-324, 450.0, 500.0, 501.5, 700.0, 1e6, 1e308])
                if wild
                else d.pick([None, 500.0])
            ),
        )

    def phase(self, job: str, wild: bool) -> PhaseEvent:
        d = self.draw
        nodes: list[str] | None = d.rng.sample(
            self.nodes, d.rng.randint(1, min(4, len(self.nodes)))
        )
        if wild:
            nodes = d.pick(
                [
                    None,
                    [],
                    nodes,
                    (nodes or []) * 2,
                    ["not-in-tree", *(nodes or [])],
                    self.nodes,
                    [f"n{i}" for i in range(300)],
                ]
            )
        elif d.chance(0.3):
            nodes = None
        return PhaseEvent(
            v=1,
            job=job,
            ts=self.wild_ts() if wild else self.clock.wall,
            phase=d.pick(PHASES),
            nodes=nodes,
            priority=d.pick(PRIORITIES) if wild or d.chance(0.3) else "normal",
            expected_s=d.pick([None, 0.0, 5e-324, 30.0, 1e308]) if wild else None,
        )

    def message(self, kind: str, name: str, carried: str, wild: bool) -> Any:
        if kind == "controller.telemetry":
            return self.telemetry(carried, name, wild)
        if kind == "controller.ack":
            return self.ack(carried, name, wild)
        if kind == "controller.status":
            return self.status(carried, wild)
        return self.phase(carried, wild)

    def as_obj(self, message: Any) -> Any:
        """A message as ``Obj`` (nested), to mess up member by member."""
        return _to_obj(json.loads(encode(message)))

    def payload(self, kind: str, generator: str, name: str, carried: str) -> bytes:
        d = self.draw
        if generator == "random_bytes":
            return d.raw_bytes()
        if generator == "random_json":
            return d.random_json()
        # a message needs a valid name to be built: a wild one is put in as text afterwards
        valid_name = carried if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", carried) else "x"
        message = self.message(kind, name, valid_name, wild=generator == "valid_wild")
        if generator in ("valid", "valid_wild"):
            body = encode(message)
            if valid_name != carried:
                body = body.replace(json.dumps(valid_name).encode(), dump(carried).encode(), 1)
            return body
        if generator == "mutated":
            return d.mutate_bytes(encode(message))[1]
        gpu_fields = (
            ["index", "power_w", "cap_w", "cap_min_w", "cap_max_w", "max_sm_clock_mhz"]
            if kind in ("controller.telemetry", "controller.ack")
            else []
        )
        obj = d.mess_up(self.as_obj(message), gpu_fields)
        return dump(obj).encode("utf-8", "surrogatepass")

    # --- one step ---

    def step(self, target: str) -> None:
        d, tally = self.draw, self.tallies[target]
        if self.handled and self.handled % CONTROLLER_REBUILD_EVERY == 0:
            self.build()
        self.handled += 1
        started = time.perf_counter()
        generator = d.weighted(CONTROLLER_GENERATORS)
        self.owner = None
        if target == "controller.phase":
            name = d.pick(["job-a", "job-b", "j3"] if d.chance(0.95) else WILD_NAMES)
            carried = name if d.chance(0.95) else "job-other"
            self.owner = JOB_OWNERS.get(name)  # its owner mostly, anyone sometimes
            if d.chance(0.25):
                self.owner = d.pick([None, "alice", "bob", "mallory"])
        else:
            name, carried = self.pick_node()
        payload = self.payload(target, generator, name, carried)
        self.deliver(target, generator, name, payload, tally)
        tally.seconds += time.perf_counter() - started
        if d.rng.random() < 1 / CYCLE_EVERY:
            self.cycle(target, generator, payload)

    def deliver(self, target: str, generator: str, name: str, payload: bytes, tally: Tally) -> None:
        core = self.core
        before = core.rejected_total
        try:
            if target == "controller.telemetry":
                returned: Any = core.on_telemetry(name, payload)
                ok = isinstance(returned, Telemetry) or (
                    returned is None and name not in self.tree.server_ordinal
                )
            elif target in ("controller.ack", "controller.status"):
                take: Callable[[str, bytes], object] = (
                    core.on_ack if target == "controller.ack" else core.on_status
                )
                returned = take(name, payload)
                ok = returned is None
            else:
                owners = {j: job.owner for j, job in core.jobs.items()}
                returned = core.on_phase(name, payload, owner=self.owner)
                ok = returned is None or isinstance(returned, PhaseEvent)
                if isinstance(returned, PhaseEvent):
                    self.check_owner(name, returned, owners, generator, payload, tally)
        except Exception as exc:
            tally.took(generator, False, "exception")
            tally.violate(generator, payload, f"exception: {type(exc).__name__}: {exc}")
            return
        invalid = core.rejected_total > before
        unknown = target != "controller.phase" and name not in self.tree.server_ordinal
        if invalid:
            outcome = "invalid"
        elif unknown:
            outcome = "unknown_node"
        elif returned is None and target in ("controller.telemetry", "controller.phase"):
            outcome = "ignored"
        else:
            outcome = "taken"
        tally.took(generator, not (invalid or unknown), outcome)
        if not ok and not invalid:
            tally.violate(generator, payload, f"returned {type(returned).__name__}")

    def check_owner(
        self,
        job: str,
        event: PhaseEvent,
        owners: dict[str, str | None],
        generator: str,
        payload: bytes,
        tally: Tally,
    ) -> None:
        """A job belongs to whoever announced it first, within the owner's priority allowance
        (issue 12): an accepted announcement keeps it so."""
        settings, owner = self.core.settings, self.owner
        if job in owners and owners[job] != owner:
            tally.violate(generator, payload, f"job {job} of {owners[job]!r} changed by {owner!r}")
        if not settings.job_priority_allowed(owner, event.priority):
            tally.violate(generator, payload, f"{owner!r} announced {event.priority} for {job}")
        if owner is None and not settings.accept_unowned_jobs:
            tally.violate(generator, payload, f"job {job} taken from the unowned topic")
        held = self.core.jobs.get(job)
        if event.phase != "shutdown" and held is not None and held.owner != owner:
            tally.violate(generator, payload, f"job {job} held by {held.owner!r}, not {owner!r}")

    def cycle(self, target: str, generator: str, payload: bytes) -> None:
        d, core, tree = self.draw, self.core, self.tree
        self.clock.advance(
            d.pick([0.001, 0.25, 1.0, 1.0, 1.0, 2.5]) if d.chance(0.97) else d.pick([8.0, 30.0])
        )
        if d.chance(0.01):
            core.new_epoch(core.epoch + 1)
        started = time.perf_counter()
        tally = self.tallies[target]
        context = f"cycle after {target}/{generator}"
        try:
            result = core.cycle()
        except Exception as exc:
            self.cycles.violations += 1
            tally.violate(context, payload, f"exception in cycle: {type(exc).__name__}: {exc}")
            return
        finally:
            self.cycles.cycles += 1
            self.cycles.seconds += time.perf_counter() - started
        problems = check_cycle(result, tree, core.epoch)
        for problem in problems:
            self.cycles.violations += 1
            tally.violate(context, payload, problem)
        self.cycles.commands += len(result.commands)
        self.sent = (self.sent + result.commands)[-64:]


def check_cycle(result: CycleResult, tree: Any, epoch: int) -> list[str]:
    """What is wrong with a cycle's decision and commands (nothing, normally)."""
    problems = []
    caps = np.asarray(result.decision.cap_w, dtype=float)
    lo, hi = np.asarray(tree.cap_min_w, dtype=float), np.asarray(tree.cap_max_w, dtype=float)
    if not np.all(np.isfinite(caps)):
        problems.append(f"decision caps not finite: {int(np.sum(~np.isfinite(caps)))} GPUs")
    elif np.any(caps < lo - 1e-6) or np.any(caps > hi + 1e-6):
        bad = int(np.flatnonzero((caps < lo - 1e-6) | (caps > hi + 1e-6))[0])
        problems.append(f"decision cap out of range: GPU {bad} at {caps[bad]} W")
    for node, command in result.commands:
        server = tree.server_ordinal.get(node)
        if server is None:
            problems.append(f"command to a node not in the tree: {node!r}")
            continue
        gpus = tree.server_gpus[server]
        if command.epoch != epoch:
            problems.append(f"command to {node} in epoch {command.epoch}, leading {epoch}")
        for g in command.gpus:
            if not 0 <= g.index < len(gpus):
                problems.append(f"command to {node} for GPU {g.index}; it has {len(gpus)}")
                continue
            i = gpus.start + g.index
            if g.cap_w is not UNSET and not (
                math.isfinite(g.cap_w) and lo[i] - 1e-6 <= g.cap_w <= hi[i] + 1e-6
            ):
                problems.append(
                    f"command cap out of range: {node} GPU {g.index} at {g.cap_w!r} W, "
                    f"[{lo[i]}, {hi[i]}]"
                )
            clock = g.max_sm_clock_mhz
            if (
                clock is not UNSET
                and clock is not None
                and not (math.isfinite(clock) and clock > 0)
            ):
                problems.append(f"command clock not a clock: {node} GPU {g.index} at {clock!r}")
        try:
            encode(command)
        except ProtocolError as exc:
            problems.append(f"command does not encode: {node}: {exc}")
    return problems


def _to_obj(value: Any) -> Any:
    if isinstance(value, dict):
        return Obj((k, _to_obj(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_to_obj(v) for v in value]
    return value


# --- the config parsers -------------------------------------------------------------------

TOML_VALUES = [
    *words("0 -1 1 42 9223372036854775807 -9223372036854775808 0x7f 0o17 0b101 1_000"),
    "1" + "0" * 400,
    "-" + "9" * 320,
    *words("0.0 -0.0 1.5 1e308 1e309 inf -inf nan +nan 5e-324 0.05 0.049999 86400.0 86400.1"),
    *words('"x" "" "名前" "r01-n03" "4xH100" "0xH100" "99999999xH100" "controlled" "local"'),
    *words('"keep" "restore" \'literal\' "\\u0000" true false'),
    *words('"mqtt://localhost:1883" "mqtts://h:99999" "mqtt://user:pw@h" "mqtt://[::1]:1883"'),
    *words('"mqtt://" "http://x"'),
    '"""multi\nline"""',
    *words('[] [1,2] ["a"] [1,"a"] [[1]] ["controller.pub"] [""] [0,0] [-1]'),
    *words('{} {a=1} {0=450.0} {"1_0"=1}'),
    *words("1979-05-27T07:32:00Z 1979-05-27 07:32:00"),
    *words("= [ NaN 1e 01 'unterminated"),
    "",
]
NUMBER_VALUES = [
    *words("0 -1 1 0.05 0.5 0.98 1.0 2 100 5000 5000.1 65535 65536 86400 86401 100000"),
    *words("1e308 1e309 -1e308 5e-324 inf -inf nan 9223372036854775807 9223372036854775808"),
    "1" + "0" * 308,
    "1" + "0" * 400,
    *words('"1" true [1]'),
]
SAFE_COUNTS = ["0", "-1", "1", "2", "3", "1.5", '"2"', "true", "100001", "1" + "0" * 400]
SAFE_STARTS = ["0", "-1", "1000000000", "1000000001", "1.5", "1" + "0" * 400]
TEMPLATE_FIELDS = [
    *words("{i} {i:02d} {i:0{w}d} {i:>{w}} {i:.{w}f} {rack:^{w}} {row:<{w}} {site:{w}}"),
    *words("{i!r} {i.real} {i[0]} {0} {} { } {{ {i:,} {i:%} {i:e} {i:c} {i:x} {i:q}"),
    *words("{nope} {rack}{rack}{rack}"),
]
WIDTHS = [0, 1, 2, 10, 100, 1000, 10_000]
WIDE = [100_000, 1_000_000]  # 15 % of widths, where the base is small enough (max_width)
_ASSIGN = re.compile(r"^(\s*)([A-Za-z0-9_.\"-]+)(\s*=\s*)(.*?)(\s*(#.*)?)$")
_NUMBER = re.compile(r"^[-+]?(\d[\d_]*(\.\d+)?([eE][-+]?\d+)?|inf|nan)$")


class ConfigFuzz:
    """Generated TOML texts into ``load_config``, ``load_controller_config``, ``parse_budgets``."""

    def __init__(self, draw: Draw, tallies: dict[str, Tally], directory: Path) -> None:
        self.draw, self.tallies = draw, tallies
        self.agent_path = directory / "agent.toml"
        self.controller_path = directory / "controller.toml"
        self.agent_example = (DATA / "agent.example.toml").read_text()
        self.controller_example = (DATA / "controller.example.toml").read_text()
        budgets = DATA / "budgets"
        self.tiny = (budgets / "tiny.toml").read_text()
        self.demo = (budgets / "demo.toml").read_text()
        self.site = (budgets / "site-150mw.toml").read_text()
        self.agent_known = {
            "agent": words(
                "node cluster mode period_s failsafe_after_s on_exit simulate gpu_indices "
                "max_command_ttl_s"
            ),
            "broker": words(
                "url username password_file ca_file cert_file key_file keepalive_s "
                "reconnect_min_s reconnect_max_s"
            ),
            "failsafe": ["cap_w", "caps_w", "fraction"],
            "trust": ["controller_keys"],
        }
        self.controller_known = {
            "controller": words(
                "name cluster infer_phases ingest_share max_raises_per_s cycle_s heartbeat_s "
                "stale_after_s ack_timeout_s command_ttl_s takeover_after_s epoch_discovery_s "
                "infer_window_s agent_failsafe_after_s"
            ),
            "broker": self.agent_known["broker"],
            "policy": sorted(f.name for f in dataclasses.fields(PolicySettings)),
            "trust": ["signing_key", "controller_keys"],
            "recorder": words("enabled url token_file file fine_every_s file_max_mb file_keep"),
        }

    # --- texts ---

    def random_toml(self, known: dict[str, list[str]]) -> str:
        d = self.draw
        lines = []
        for section in [*known, "nope"]:
            if not d.chance(0.7 if section != "nope" else 0.05):
                continue
            if d.chance(0.03):
                lines.append(f"{section} = {d.pick(TOML_VALUES)}")
                continue
            lines.append(f"[{section}]")
            for _ in range(d.rng.randrange(7)):
                keys = known.get(section, ["x"])
                key = d.pick(keys) if d.chance(0.9) else d.pick(["x", "名", '"a b"'])
                value = d.pick(NUMBER_VALUES) if d.chance(0.5) else d.pick(TOML_VALUES)
                lines.append(f"{key} = {value}")
        return "\n".join(lines) + "\n"

    def mutate(self, text: str, *, budgets: bool = False, max_width: int = 1_000_000) -> str:
        d = self.draw
        lines = text.splitlines()
        for _ in range(d.pick([1, 1, 1, 2, 2, 3, 4])):
            ops = {
                "delete": 1.0,
                "duplicate": 0.7,
                "uncomment": 0.7 if not budgets else 0.2,
                "number": 3.0,
                "swap_type": 1.5,
                "garbage": 0.5,
                "swap_lines": 0.5,
                "truncate": 0.3,
            }
            if budgets:
                ops |= {"template": 1.5, "unit": 0.7, "model": 0.5}
            op = d.weighted(ops)
            if not lines:
                break
            i = d.rng.randrange(len(lines))
            if op == "delete":
                del lines[i]
            elif op == "duplicate":
                lines.insert(i, lines[i])
            elif op == "uncomment":
                commented = [k for k, line in enumerate(lines) if re.match(r"^#\s*\w+ = ", line)]
                if commented:
                    k = d.pick(commented)
                    lines[k] = lines[k].lstrip("# ")
            elif op in ("number", "swap_type"):
                matches = [(k, m) for k, line in enumerate(lines) if (m := _ASSIGN.match(line))]
                assigns = [k for k, _ in matches]
                if op == "number":
                    assigns = [k for k, m in matches if _NUMBER.match(m.group(4))] or assigns
                if assigns:
                    k = d.pick(assigns)
                    m = _ASSIGN.match(lines[k])
                    assert m is not None
                    key = m.group(2)
                    if key == "count":
                        value = d.pick(SAFE_COUNTS)
                    elif key == "start":
                        value = d.pick(SAFE_STARTS)
                    elif op == "number":
                        value = d.pick(NUMBER_VALUES)
                    else:
                        value = d.pick(TOML_VALUES)
                    lines[k] = f"{m.group(1)}{key}{m.group(3)}{value}"
            elif op == "garbage":
                lines.insert(
                    i,
                    d.pick(
                        [
                            f"{d.pick(['x', 'name', 'limit_w', 'count'])} = {d.pick(TOML_VALUES)}",
                            f"[{d.pick(['site', 'rows', 'x', 'models.H100', 'agent', 'policy'])}]",
                            f"[[{d.pick(['rows', 'rows.racks', 'rows.racks.nodes', 'x'])}]]",
                            d.text(),
                        ]
                    ),
                )
            elif op == "swap_lines":
                j = d.rng.randrange(len(lines))
                lines[i], lines[j] = lines[j], lines[i]
            elif op == "truncate":
                joined = "\n".join(lines)
                lines = joined[: d.rng.randrange(len(joined) + 1)].splitlines()
            elif op == "template":
                names = [k for k, line in enumerate(lines) if re.match(r'^\s*name\s*=\s*"', line)]
                if names:
                    k = d.pick(names)
                    width = min(d.pick(WIDE if d.chance(0.15) else WIDTHS), max_width)
                    fields = d.pick(TEMPLATE_FIELDS).replace("{w}", str(width))
                    head = lines[k].split("#", 1)[0].rstrip()
                    inside = (
                        head[head.index('"') + 1 : head.rindex('"')] if head.count('"') >= 2 else ""
                    )
                    if "{i" in inside and d.chance(0.6):  # the generator's own field replaced
                        found = re.search(r"\{i(:[^{}]*)?\}", inside)
                        new = (
                            inside
                            if found is None
                            else (inside[: found.start()] + fields + inside[found.end() :])
                        )
                    else:  # or one more put in anywhere
                        where = d.rng.randint(0, len(inside))
                        new = inside[:where] + fields + inside[where:]
                    lines[k] = f"name = {json.dumps(new)}"
            elif op == "unit":
                k = d.rng.randrange(len(lines))
                lines[k] = re.sub(
                    r"\b(limit|budget|overhead)_(w|kw|mw)\b|\bramp_(w|kw|mw)_per_s\b",
                    lambda m: (
                        f"{m.group(1)}_{d.pick(['w', 'kw', 'mw', 'gw'])}"
                        if m.group(1)
                        else f"ramp_{d.pick(['w', 'kw', 'mw'])}_per_s"
                    ),
                    lines[k],
                )
            else:  # model
                k = d.rng.randrange(len(lines))
                lines[k] = re.sub(
                    r"\b(H100|GB200)\b",
                    lambda m: d.pick(["h100", "GB200", "B200", "", "A100", "h 100", "H100 "]),
                    lines[k],
                )
        return "\n".join(lines) + "\n"

    def noise(self, text: str) -> bytes:
        """Bytes that are not all text: flipped bytes, a stray NUL, invalid UTF-8, random."""
        d = self.draw
        data = bytearray(text.encode())
        kind = d.pick(["flip", "invalid_utf8", "nul", "random"])
        if kind == "random":
            return d.rng.randbytes(d.pick([0, 10, 500]))
        for _ in range(d.rng.randint(1, 5)):
            i = d.rng.randrange(len(data) + 1)
            if kind == "flip" and i < len(data):
                data[i] ^= 1 << d.rng.randrange(8)
            else:
                data[i:i] = b"\xff\xfe" if kind == "invalid_utf8" else b"\x00"
        return bytes(data)

    def random_budgets(self) -> str:
        """A small tree that holds (limits above what it can draw), with one in ~20 choices
        made wrong: the parser's accepting paths, and its checks one fault at a time."""
        d = self.draw

        def mostly(good: Any, *bad: Any) -> Any:
            return d.pick(bad) if bad and d.chance(0.04) else good

        model = d.pick(["H100", "GB200", "A100"])
        per_gpu = {"H100": 700, "GB200": 1200, "A100": 400}[model]
        out = [f"version = {mostly('1', '2', '1.0', 'true')}"]
        if d.chance(0.3):
            out += [
                "[defaults]",
                f"cap_threshold = {mostly('0.98', '1.5', '0.5')}",
                f"cap_target = {mostly('0.95', '0.99')}",
                f"uncap_threshold = {mostly('0.90', '0.97', '0')}",
            ]
        rows, racks, nodes = d.rng.randint(1, 3), d.rng.randint(1, 3), d.rng.randint(1, 4)
        gpus = d.pick([1, 2, 4, 8])
        node_oh = 1000
        node_oh_text = mostly(node_oh, -1)  # once per tree: a file gets it right or wrong
        rack_w = nodes * (gpus * per_gpu + node_oh) * mostly(1.05, 0.5) + 100
        row_w = racks * rack_w * mostly(1.05, 0.5)
        site_w = rows * row_w * mostly(1.05, 0.5)
        out += [
            "[site]",
            f'name = "{mostly("site-x", "", "名", "a" * 65)}"',
            f"limit_w = {site_w:.0f}",
            f"budget_w = {site_w * mostly(0.95, 1.01):.0f}",
        ]
        if d.chance(0.5):
            out.append(f"ramp_w_per_s = {mostly(d.pick(['1000', '1e6']), '0', '1e-9', '1e12')}")
        out += [
            f"[models.{mostly(model, 'B300', 'h100')}]",
            f"failsafe_cap_w = {mostly(per_gpu * 0.8, 1, per_gpu * 2, -1):g}",
        ]
        if d.chance(0.5):
            out.append(f"comm_clock_mhz = {mostly(1100, 0, 5000, 1.1)}")
        for r in range(rows):
            out += [
                "[[rows]]",
                f'name = "r{r}"',
                f"limit_w = {row_w:.0f}",
                f"budget_w = {row_w * 0.95:.0f}",
            ]
            if d.chance(0.5):  # generators
                out += [
                    "[rows.racks]",
                    f"count = {racks}",
                    f'name = "{mostly("{row}-k{i:02d}", "k{i}", "{row}-k", "{rack}-k{i}")}"',
                    f"limit_w = {rack_w:.0f}",
                    f"budget_w = {rack_w * 0.95:.0f}",
                    "[rows.racks.nodes]",
                    f"count = {nodes}",
                    f'name = "{mostly("{rack}-n{i}", "n{i}", "{rack}-n{i:0100d}")}"',
                    f"gpus = {mostly(gpus, 0, 1025)}",
                    f'model = "{model}"',
                    f"overhead_w = {node_oh_text}",
                ]
                continue
            for k in range(racks):
                out += [
                    "[[rows.racks]]",
                    f'name = "r{r}-k{k}"',
                    f"limit_w = {rack_w:.0f}",
                    f"budget_w = {rack_w * 0.95:.0f}",
                ]
                for n in range(nodes):
                    out += [
                        "[[rows.racks.nodes]]",
                        f'name = "r{r}-k{mostly(k, 0)}-n{n}"',
                        f"gpus = {gpus}",
                        f'model = "{mostly(model, "V100")}"',
                        f"overhead_w = {node_oh_text}",
                    ]
        return "\n".join(out) + "\n"

    def scaled_site(self) -> str:
        """The shipped 150 MW site with small generator counts (all 20,736 nodes: 1 in 500)."""
        d = self.draw
        if d.chance(0.002):
            return self.site
        text = self.site.replace("count = 16", f"count = {d.rng.randint(1, 2)}", 1)
        text = text.replace("count = 72", f"count = {d.rng.randint(1, 3)}", 1)
        return text.replace("count = 18", f"count = {d.rng.randint(1, 18)}", 1)

    # --- one step ---

    def step(self, target: str) -> None:
        d, tally = self.draw, self.tallies[target]
        started = time.perf_counter()
        text: str | bytes
        base: tuple[str, str] | None = None  # (name, text) of what was mutated
        if target == "config.budgets":
            generator = d.weighted(
                {"random_toml": 0.5, "random_tree": 2, "tiny": 2, "demo": 2, "site": 3.5}
            )
            if generator == "random_toml":
                text = self.random_toml({"site": ["name", "limit_w"], "rows": ["name"]})
            elif generator == "random_tree":
                text = self.random_budgets()
                if d.chance(0.5):
                    base = ("a random tree", text)
                    text = self.mutate(text, budgets=True)
            else:
                original = {"tiny": self.tiny, "demo": self.demo}.get(generator)
                original = original or self.scaled_site()
                full = original is self.site
                # widths bounded by the names they multiply: all 20,736 nodes of the site at
                # 100,000 characters each is the 2 GB case of issue 12, not for every run
                widest = 100 if full else 100_000 if generator == "site" else 1_000_000
                text = self.mutate(original, budgets=True, max_width=widest)
                generator += "/full" if full else ""
                base = (f"budgets/{generator.split('/')[0]}", original)
        else:
            known = self.agent_known if target == "config.agent" else self.controller_known
            example = self.agent_example if target == "config.agent" else self.controller_example
            generator = d.weighted({"random_toml": 3, "mutated_example": 6, "bytes": 1})
            if generator == "random_toml":
                text = self.random_toml(known)
            elif generator == "mutated_example":
                text = self.mutate(example)
                base = (f"{target.split('.')[1]}.example.toml", example)
            else:
                text = self.noise(self.mutate(example) if d.chance(0.7) else example)
        parsed = time.perf_counter()
        outcome, exc = self.attempt(target, text)
        tally.timed(time.perf_counter() - parsed, text, self.show(text, base))
        tally.took(generator, exc is None and outcome in ("config", "topology"), outcome)
        if exc is not None:
            minimal = None
            if tally.wants_examples and isinstance(text, str):
                minimal = self.minimize(target, text, type(exc))
            problem = f"exception: {type(exc).__name__}: {exc}"
            tally.violate(generator, text, problem, self.show(text, base), minimal)
        tally.seconds += time.perf_counter() - started

    def attempt(self, target: str, text: str | bytes) -> tuple[str, Exception | None]:
        """Parse ``text`` as ``target`` says: (outcome, an exception that is not the parser's
        own error type, or None)."""
        expected: type[Exception] = BudgetError if target == "config.budgets" else ConfigError
        try:
            if target == "config.budgets":
                if isinstance(text, bytes):
                    text = text.decode("utf-8", "surrogateescape")
                parse_budgets(text, source="fuzz.toml")
                return "topology", None
            path = self.agent_path if target == "config.agent" else self.controller_path
            path.write_bytes(
                text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
            )
            if target == "config.agent":
                load_config(path)
            else:
                load_controller_config(path)
            return "config", None
        except expected:
            return expected.__name__, None
        except Exception as exc:
            return "exception", exc

    def minimize(self, target: str, text: str, kind: type[Exception]) -> str:
        """``text`` with every line removed that the same exception does without."""
        lines = text.splitlines()

        def fails(trial: list[str]) -> bool:
            return type(self.attempt(target, "\n".join(trial) + "\n")[1]) is kind

        chunk = max(1, len(lines) // 2)
        while True:
            i = 0
            while i < len(lines):
                trial = lines[:i] + lines[i + chunk :]
                if trial and fails(trial):
                    lines = trial
                else:
                    i += chunk
            if chunk == 1:
                break
            chunk //= 2
        return "\n".join(lines) + "\n"

    @staticmethod
    def show(text: str | bytes, base: tuple[str, str] | None) -> str:
        """A mutated text as its changes (a diff against what it was), else as it is."""
        if base is None or not isinstance(text, str):
            return _short(text)
        name, original = base
        changed = [
            line
            for line in difflib.unified_diff(original.splitlines(), text.splitlines(), n=0)
            if line[:1] in "+-" and line[:3] not in ("+++", "---")
        ]
        return _short(f"{name}, changed: " + "\n".join(changed))


# --- the run ------------------------------------------------------------------------------


@contextmanager
def quiet_logs() -> Iterator[None]:
    """The cores log every bad payload (rate-limited); a fuzz run makes only bad payloads."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def run(
    payloads: int,
    seed: int,
    targets: Sequence[str] = TARGETS,
    agent_core: type[AgentCore] = AgentCore,
    controller_core: type[ControllerCore] = ControllerCore,
) -> dict[str, Any]:
    """Send ``payloads`` generated inputs over ``targets``; the counts, as a dict."""
    counts = split(payloads, targets)
    tallies = {t: Tally() for t in targets}
    started = time.perf_counter()
    cycles = CycleTally()
    with quiet_logs(), tempfile.TemporaryDirectory(prefix="powerd-fuzz-") as tmp:
        agent_steps = [t for t in AGENT_TARGETS if t in counts for _ in range(counts[t])]
        if agent_steps:
            rng = random.Random(f"{seed}/agent")
            rng.shuffle(agent_steps)
            agent = AgentFuzz(
                Draw(rng),
                tallies,
                fixed_signer(seed, "controller"),
                fixed_signer(seed, "stranger"),
                agent_core,
            )
            for target in agent_steps:
                agent.step(target)
        controller_steps = [t for t in CONTROLLER_TARGETS if t in counts for _ in range(counts[t])]
        if controller_steps:
            rng = random.Random(f"{seed}/controller")
            rng.shuffle(controller_steps)
            controller = ControllerFuzz(Draw(rng), tallies, controller_core)
            for target in controller_steps:
                controller.step(target)
            cycles = controller.cycles
        config_steps = [t for t in CONFIG_TARGETS if t in counts for _ in range(counts[t])]
        if config_steps:
            rng = random.Random(f"{seed}/config")
            rng.shuffle(config_steps)
            configs = ConfigFuzz(Draw(rng), tallies, Path(tmp))
            for target in config_steps:
                configs.step(target)
    elapsed = time.perf_counter() - started
    totals = {
        k: sum(getattr(t, k) for t in tallies.values())
        for k in ("sent", "accepted", "rejected", "violations")
    }
    argv = " ".join(sys.argv[1:])
    return {
        "benchmark": "fuzz",
        "machine": machine(),
        "command": f"python -m bench.fuzz {argv}".strip(),
        "date": datetime.date.today().isoformat(),
        "payloads": payloads,
        "seed": seed,
        "seconds": round(elapsed, 2),
        "per_s": round(payloads / elapsed) if elapsed > 0 else None,
        "totals": totals,
        "controller_cycles": {
            "cycles": cycles.cycles,
            "commands": cycles.commands,
            "seconds": round(cycles.seconds, 3),
            "violations": cycles.violations,
        },
        "slow_parse_s": SLOW_PARSE_S,
        "targets": {t: tallies[t].as_dict() for t in targets},
    }


def table(result: dict[str, Any]) -> str:
    """The counts per target, as a small text table."""
    head = f"{'target':<22}{'sent':>8}{'rejected':>10}{'accepted':>10}{'violations':>12}"
    head += f"{'seconds':>9}{'slowest':>10}"
    lines = [head, "-" * len(head)]
    for name, t in result["targets"].items():
        slowest = f"{t['slowest_s']:.3f} s" if "slowest_s" in t else ""
        lines.append(
            f"{name:<22}{t['sent']:>8}{t['rejected']:>10}{t['accepted']:>10}"
            f"{t['violations']:>12}{t['seconds']:>9.1f}{slowest:>10}"
        )
    tot = result["totals"]
    lines.append("-" * len(head))
    lines.append(
        f"{'total':<22}{tot['sent']:>8}{tot['rejected']:>10}{tot['accepted']:>10}"
        f"{tot['violations']:>12}{result['seconds']:>9.1f}"
    )
    cyc = result["controller_cycles"]
    lines.append(
        f"controller cycles: {cyc['cycles']} ({cyc['commands']} commands, "
        f"{cyc['seconds']:.1f} s; their violations are in the target that preceded them)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payloads", type=int, default=100_000, help="in all, over the targets")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help=f"comma-separated, of: {', '.join(TARGETS)}",
    )
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    targets = [t for t in args.targets.split(",") if t]
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or not targets:
        parser.error(f"unknown target(s) {unknown}; known: {', '.join(TARGETS)}")
    result = run(args.payloads, args.seed, targets)
    report(result, args.json)
    print(table(result))
    if result["totals"]["violations"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
