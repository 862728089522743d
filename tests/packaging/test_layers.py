"""The layering docs/ARCHITECTURE.md states, checked on the imports themselves (ast): a
module that breaks a rule fails here, naming the import. The layer table is defined once,
in ``tests/packaging/layers.py``; the docs' table is rendered from it."""

from __future__ import annotations

import pytest

from tests.packaging.layers import (
    DOC,
    FIRST_PARTY,
    LAYERS,
    doc_table,
    imports_of,
    module_name,
    render,
    sources,
    unit_of,
    unlayered,
    violations,
)
from tests.support.paths import REPO


def first_party_imports(path) -> set[str]:
    """Every first-party module ``path`` imports, lazily or not (TYPE_CHECKING included)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = {name for name, _ in imports_of(path.read_text("utf-8"), package)}
    return {name for name in found if name.split(".")[0] in FIRST_PARTY}


def within(name: str, allowed: tuple[str, ...]) -> bool:
    """``powerd`` alone is the package's ``__init__`` (its version), not every module."""
    return any(name == a or (a != "powerd" and name.startswith(a + ".")) for a in allowed)


def test_every_module_has_a_layer() -> None:
    assert not unlayered(), f"add these to tests/packaging/layers.py LAYERS: {unlayered()}"


def test_no_module_imports_up_or_sideways() -> None:
    """Each unit imports only itself and units of lower layers: no circle is possible."""
    assert not violations(), violations()


def test_the_architecture_doc_shows_the_layers_as_the_code_has_them() -> None:
    assert doc_table(DOC.read_text("utf-8")) == render(), (
        "docs/ARCHITECTURE.md's layer table is out of date: python -m tests.packaging.layers"
    )


# Rules within the layering, stricter than it: (modules, what they may import of the first
# party).
RULES = [
    (["powerd/vocabulary.py"], ()),
    (["powerd/hostlist.py"], ()),  # names on the wire: the protocol expands them
    (["powerd/protocol"], ("powerd.protocol", "powerd.vocabulary", "powerd.hostlist")),
    (["policies"], ("policies", "powerd.vocabulary")),
    (["powerd/mqtt"], ("powerd.mqtt", "powerd.backoff")),
    # the agent never reaches the controller, the planner, the demo, the fleet or the recorder
    (
        ["powerd/agent"],
        (
            "powerd.agent",
            "powerd.gpu",
            "powerd.protocol",
            "powerd.vocabulary",
            "powerd.signing",
            "powerd.configfile",
            "powerd.clock_skew",
            "powerd.mqtt.url",
            "powerd.mqtt.session",
            "powerd.backoff",
            "powerd.ratelimit",
            "powerd.systemd",
            "powerd.metrics",  # its agent, readings and server modules: no numpy
            "powerd",
            "powerd.__version__",
        ),
    ),
]


@pytest.mark.parametrize(("roots", "allowed"), RULES, ids=[r[0][0] for r in RULES])
def test_each_layer_imports_only_what_it_may(roots: list[str], allowed: tuple[str, ...]) -> None:
    offending = {
        f"{path.relative_to(REPO)} imports {name}"
        for path in sources(*roots)
        for name in first_party_imports(path)
        if not within(name, allowed)
    }
    assert not offending, sorted(offending)


def test_nothing_in_the_runtime_imports_the_planner_bench_or_tests() -> None:
    offending = {
        f"{path.relative_to(REPO)} imports {name}"
        for path in sources("powerd", "policies")
        for name in first_party_imports(path)
        if within(name, ("planner", "bench", "tests"))
    }
    assert not offending, sorted(offending)


def test_the_checker_sees_an_import_that_breaks_a_rule() -> None:
    """The check itself can fail: a lazy import of the controller, a relative one, found;
    ``powerd`` allows the version, not the whole package; a unit sits in its layer."""
    lazy = "def f():\n    from powerd.controller import core\n    return core\n"
    assert ("powerd.controller.core", True) in imports_of(lazy, "powerd.agent")
    relative = imports_of("from ..controller import core\n", "powerd.agent")
    assert ("powerd.controller", False) in relative
    assert not within("powerd.controller", ("powerd",))
    assert unit_of("powerd.mqtt.link") == "powerd.mqtt"
    assert unit_of("powerd.telemetry_schema") == "powerd.telemetry_schema"
    assert unit_of("powerd.anything_new") is None  # a new module must be given a layer
    layer = dict((name, n) for n, name in LAYERS)
    assert layer["powerd.agent"] > layer["powerd.mqtt"] > layer["powerd.backoff"]
