"""The layer table: one definition, checked on the imports and rendered into the docs.

Every first-party module belongs to one *unit* (a package or a module, the longest name in
``LAYERS`` that contains it), and every unit to one layer. A module may import its own
unit and units of lower layers, nothing else: no import back up, no import sideways, so
no circle. ``tests/packaging/test_layers.py`` checks that on every import (lazy ones and
those under ``TYPE_CHECKING`` included) and that docs/ARCHITECTURE.md's table is what
:func:`render` makes of the code as it is; ``python -m tests.packaging.layers`` rewrites
that table.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.paths import REPO

FIRST_PARTY = ("powerd", "policies", "planner", "bench", "tests")
ROOTS = ("powerd", "policies", "planner", "bench")  # what the table covers
DOC = REPO / "docs" / "ARCHITECTURE.md"
BEGIN = "<!-- generated: python -m tests.packaging.layers -->"
END = "<!-- end generated -->"

# (layer, unit): a unit imports only its own modules and units of lower layers.
LAYERS: list[tuple[int, str]] = [
    (10, "bench"),
    (10, "powerd.__main__"),
    (9, "powerd.cli"),
    (9, "planner"),
    (8, "powerd.demo"),
    (8, "powerd.fleet"),  # runs the agent's own rules (powerd.agent.rules)
    (7, "powerd.controller"),
    (7, "powerd.coordinator"),
    (7, "powerd.agent"),
    (6, "powerd.site_limits"),
    (6, "powerd.site_config"),  # powerd site generate: a site's files from its budgets
    (5, "powerd.topology"),
    (5, "powerd.leadership"),
    (5, "powerd.jobhook"),
    (4, "powerd.configfile"),
    (4, "powerd.grafana"),
    (4, "powerd.recorder"),
    (3, "powerd.signing"),
    (3, "powerd.telemetry_schema"),
    (3, "powerd.gpu"),
    (3, "powerd.metrics"),  # prometheus_client; the daemons' feeds live in their packages
    (2, "powerd.protocol"),
    (2, "policies"),
    (1, "powerd.hostlist"),
    (1, "powerd.mqtt"),
    (1, "powerd.clock_skew"),
    (1, "powerd.click_types"),
    (1, "powerd.reference"),  # click only; renders the docs' reference tables
    (0, "powerd.vocabulary"),
    (0, "powerd.units"),
    (0, "powerd.line_protocol"),
    (0, "powerd.backoff"),
    (0, "powerd.ratelimit"),
    (0, "powerd.extras"),
    (0, "powerd.systemd"),
    (0, "powerd.data"),
    (0, "powerd"),  # powerd/__init__.py: the version
]
PACKAGE_ONLY = {"powerd"}  # units that are their __init__ alone, not their submodules


@dataclass
class Unit:
    name: str
    layer: int
    modules: list[str] = field(default_factory=list)
    imports: set[str] = field(default_factory=set)  # first-party units, at import time
    lazy: set[str] = field(default_factory=set)  # first-party units, inside a function only
    third_party: set[str] = field(default_factory=set)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(*roots: str) -> list[Path]:
    """The modules under each root (a package folder or one file)."""
    paths = [REPO / root for root in roots]
    return sorted(q for p in paths for q in ([p] if p.is_file() else p.rglob("*.py")))


def imports_of(source: str, package: str) -> list[tuple[str, bool]]:
    """Every module ``source`` imports, and whether the import is inside a function (lazy);
    relative imports resolved from ``package``."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((alias.name, inside) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package, up level - 1
                    parts = package.split(".")
                    parent = parts[: len(parts) - child.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                found.append((base, inside))
                found.extend((f"{base}.{alias.name}", inside) for alias in child.names)
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def unit_of(module: str) -> str | None:
    """The unit a first-party module belongs to: the longest unit name containing it."""
    best = None
    for _, name in LAYERS:
        inside = module.startswith(name + ".") and name not in PACKAGE_ONLY
        if (module == name or inside) and (best is None or len(name) > len(best)):
            best = name
    return best


def units() -> dict[str, Unit]:
    """Every unit with its modules and what they import."""
    layer_of = {name: layer for layer, name in LAYERS}
    found = {name: Unit(name, layer) for name, layer in layer_of.items()}
    stdlib = set(sys.stdlib_module_names)
    for path in sources(*ROOTS):
        module = module_name(path)
        unit = found.get(unit_of(module) or "")
        if unit is None:
            continue  # test_every_module_has_a_layer names it
        unit.modules.append(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        now: set[str] = set()
        later: set[str] = set()
        for name, lazy in imports_of(path.read_text("utf-8"), package):
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                target = unit_of(name)
                if target is not None and target != unit.name:
                    (later if lazy else now).add(target)
            elif top and top not in stdlib and top != "__future__":
                unit.third_party.add(top)
        unit.imports |= now
        unit.lazy |= later - now
    for unit in found.values():
        unit.lazy -= unit.imports
    return found


def violations() -> list[str]:
    """Imports of a unit that is not in a lower layer, one line each."""
    layer_of = {name: layer for layer, name in LAYERS}
    out = []
    for unit in units().values():
        for target in sorted(unit.imports | unit.lazy):
            if target.split(".")[0] == "tests" and unit.name == "bench":
                continue
            if target not in layer_of or layer_of[target] >= unit.layer:
                out.append(
                    f"{unit.name} (layer {unit.layer}) imports {target} "
                    f"(layer {layer_of.get(target, '?')})"
                )
    return out


def unlayered() -> list[str]:
    return [module_name(p) for p in sources(*ROOTS) if unit_of(module_name(p)) is None]


def _short(name: str) -> str:
    return name.removeprefix("powerd.") if name != "powerd" else "powerd (version)"


def render() -> str:
    """The table of docs/ARCHITECTURE.md, from the code as it is."""
    rows = ["| layer | unit | imports (first party) | lazy | third party |", "| --- " * 5 + "|"]
    found = units()
    for layer, name in LAYERS:
        unit = found[name]
        rows.append(
            f"| {layer} | `{name}` | {', '.join(_short(u) for u in sorted(unit.imports)) or '-'}"
            f" | {', '.join(_short(u) for u in sorted(unit.lazy)) or '-'}"
            f" | {', '.join(sorted(unit.third_party)) or '-'} |"
        )
    return "\n".join(rows)


def doc_table(text: str) -> str:
    """What docs/ARCHITECTURE.md holds between the markers."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def write() -> None:
    text = DOC.read_text("utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(f"{text[:start]}\n{render()}\n{text[end:]}", "utf-8")


if __name__ == "__main__":
    write()
    print(f"wrote the layer table of {DOC.relative_to(REPO)}")
