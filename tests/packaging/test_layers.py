"""The layering docs/ARCHITECTURE.md states, checked on the imports themselves (ast):
a module that breaks a rule fails here, naming the import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

FIRST_PARTY = ("powerd", "policies", "planner", "bench", "tests")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def first_party_imports(path: Path) -> set[str]:
    """Every first-party module ``path`` imports, lazily or not (TYPE_CHECKING included)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    return imports_in(path.read_text("utf-8"), package)


def imports_in(source: str, package: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in FIRST_PARTY}


def sources(*roots: str) -> list[Path]:
    """The modules under each root (a package folder or one file)."""
    paths = [REPO / root for root in roots]
    return sorted(q for p in paths for q in ([p] if p.is_file() else p.rglob("*.py")))


def within(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


RULES = [
    # (modules, what they may import of the first party)
    (["powerd/vocabulary.py"], ()),
    (["powerd/hostlist.py"], ()),  # names on the wire: the protocol expands them
    (["powerd/protocol.py"], ("powerd.vocabulary", "powerd.hostlist")),
    (["policies"], ("policies", "powerd.vocabulary")),
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
            "powerd.mqtt_url",
            "powerd.mqtt_session",
            "powerd.backoff",
            "powerd.ratelimit",
            "powerd.systemd",
            "powerd",  # __version__
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
    """The check itself can fail: a lazy import of the controller, a relative one, are found."""
    lazy = "def f():\n    from powerd.controller import core\n    return core\n"
    assert "powerd.controller.core" in imports_in(lazy, "powerd.agent")
    assert "powerd.controller" in imports_in("from ..controller import core\n", "powerd.agent")
