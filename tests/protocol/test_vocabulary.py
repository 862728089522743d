"""One vocabulary: the protocol's types, the policies' codes and the telemetry schema's tag
values all come from powerd.vocabulary, and no module keeps a copy of its own."""

from __future__ import annotations

import re
from typing import get_args

import msgspec.inspect as mi

from policies import tree
from powerd import protocol, telemetry_schema, vocabulary
from powerd.vocabulary import LEVELS, MODES, PHASES, PRIORITIES, PROTOCOL_VERSION
from tests.support.paths import REPO


def literal_values(cls: type, field: str) -> tuple[object, ...]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    (f,) = [f for f in info.fields if f.name == field]
    kind = f.type
    if isinstance(kind, mi.UnionType):  # Optional[...]
        (kind,) = [t for t in kind.types if not isinstance(t, mi.NoneType)]
    assert isinstance(kind, mi.LiteralType), (cls, field, kind)
    return tuple(sorted(kind.values, key=str))


def test_the_protocol_types_are_the_vocabulary() -> None:
    def same(values: tuple[object, ...], words: tuple[str, ...]) -> bool:
        return values == tuple(sorted(words))

    assert literal_values(protocol.Telemetry, "v") == (PROTOCOL_VERSION,)
    assert same(literal_values(protocol.Telemetry, "mode"), MODES)
    assert same(literal_values(protocol.PhaseEvent, "phase"), PHASES)
    assert same(literal_values(protocol.PhaseEvent, "priority"), PRIORITIES)
    assert same(literal_values(protocol.Status, "state"), get_args(vocabulary.NodeState))
    assert same(literal_values(protocol.Ack, "result"), get_args(vocabulary.AckResult))
    assert same(literal_values(protocol.Heartbeat, "state"), get_args(vocabulary.ControllerState))


def test_the_policy_codes_are_the_vocabulary() -> None:
    assert tree.LEVEL_NAMES == LEVELS
    assert [tree.LEVEL_NAMES[c] for c in (tree.SITE, tree.ROW, tree.RACK, tree.SERVER)] == [
        "site",
        "row",
        "rack",
        "node",
    ]
    assert set(tree.PHASE_CODES) == set(PHASES)
    assert [PHASES[code] for code in tree.PHASE_CODES.values()] == list(PHASES)
    assert set(tree.PRIORITY_CODES) == set(PRIORITIES)
    # watts are taken from the lowest code first: low < normal < high
    assert tree.LOW < tree.NORMAL < tree.HIGH
    assert [tree.PRIORITY_CODES[p] for p in ("low", "normal", "high")] == [
        tree.LOW,
        tree.NORMAL,
        tree.HIGH,
    ]


def test_the_telemetry_schema_tags_are_the_vocabulary() -> None:
    def allowed(measurement, tag: str) -> tuple:
        (t,) = [t for t in measurement.tags if t.name == tag]
        return tuple(t.allowed)

    assert allowed(telemetry_schema.GPU, "phase") == PHASES
    assert allowed(telemetry_schema.GPU, "mode") == MODES
    assert allowed(telemetry_schema.TREE, "level") == LEVELS
    assert allowed(telemetry_schema.PHASE_EVENT, "phase") == PHASES
    assert allowed(telemetry_schema.PHASE_EVENT, "priority") == PRIORITIES


# a copy of the vocabulary, as code would write one
COPIES = {
    "priorities": re.compile(r'"high",\s*"normal",\s*"low"'),
    "phases": re.compile(r'"startup",\s*"compute",\s*"communication"'),
    "levels": re.compile(r'"site",\s*"row",\s*"rack",\s*"node"'),
    "modes": re.compile(r'"controlled",\s*"failsafe",\s*"local"'),
    "a literal protocol version": re.compile(r"\bv=1\b"),
    "the default failsafe fraction": re.compile(r"FAILSAFE_FRACTION\s*=\s*0\.8"),
}


def test_no_module_keeps_a_copy_of_its_own() -> None:
    found = []
    for package in ("powerd", "policies", "planner"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name == "vocabulary.py":
                continue
            text = path.read_text()
            found += [
                f"{path.relative_to(REPO)}: {what}" for what, p in COPIES.items() if p.search(text)
            ]
    assert found == []


def test_the_vocabulary_imports_nothing_of_powerd() -> None:
    source = (REPO / "powerd" / "vocabulary.py").read_text()
    imports = re.findall(r"^(?:from|import) ([\w.]+)", source, re.M)
    assert set(imports) <= {"__future__", "typing"}
