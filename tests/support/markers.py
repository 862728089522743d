"""Which real servers a test starts, read from what it uses: the ``broker`` and ``tsdb`` markers.

``tests/conftest.py`` gives every collected test the markers of the servers
it can reach: from the test function, the fixtures it requests (directly or
through other fixtures), and the callables it is parametrized with, it
follows every name the code loads, through the suite's own functions,
classes and modules (``tests.*``, ``bench.*``; never into ``powerd`` or
libraries), to any ``ServerProcess`` subclass: ``Mosquitto`` gives
``broker``, ``VictoriaMetrics`` and ``InfluxDB1`` give ``tsdb``
(their ``marker``). A module run as ``python -m bench.x`` counts as
used when its name is a string in the code.

Nothing is marked by hand. What the reading misses (a server reached through
``getattr`` or ``request.getfixturevalue``) does not pass unnoticed: a server
refuses to start in a test whose markers do not name it
(``tests.support.servers.check_allowed``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import types
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

from tests.support.servers import ServerProcess

SERVER_MARKERS = ("broker", "tsdb")
OURS = ("tests", "bench")
_MODULE_NAME = re.compile(r"(?:tests|bench)(?:\.\w+)+")


def _ours(name: str | None) -> bool:
    return bool(name) and str(name).split(".")[0] in OURS


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and every code object nested in it (lambdas, inner functions, classes)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _strings(consts: Iterable[object]) -> Iterator[str]:
    for const in consts:
        if isinstance(const, str):
            yield const
        elif isinstance(const, (tuple, frozenset)):
            yield from _strings(const)


class ServerFinder:
    """Follows what an object uses to the servers it can start; results kept per object."""

    def __init__(self) -> None:
        self._cache: dict[int, frozenset[str]] = {}
        self._keep: list[object] = []  # the cache's keys are ids: keep their objects alive

    def markers_of(self, *objects: object) -> frozenset[str]:
        """The markers (``broker``, ``tsdb``) of the servers any of ``objects`` can start."""
        found: set[str] = set()
        for obj in objects:
            key = id(obj)
            if key not in self._cache:
                self._cache[key] = frozenset(_Walk().visit_all([obj]))
                self._keep.append(obj)
            found |= self._cache[key]
        return frozenset(found)


class _Walk:
    """One depth-first walk; ``seen`` ends cycles (a helper that calls itself, two modules)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.found: set[str] = set()

    def visit_all(self, objects: Iterable[object]) -> set[str]:
        stack = list(objects)
        while stack:
            obj = stack.pop()
            if id(obj) in self.seen:
                continue
            self.seen.add(id(obj))
            stack.extend(self._uses(obj))
        return self.found

    def _uses(self, obj: object) -> Iterable[object]:
        """What ``obj`` refers to, one step on; a server class adds its marker instead."""
        if isinstance(obj, type):
            if issubclass(obj, ServerProcess):
                if obj.marker is not None:
                    self.found.add(obj.marker)
                return ()
            if _ours(obj.__module__):
                return [*vars(obj).values(), *obj.__bases__]
            return ()
        if isinstance(obj, (staticmethod, classmethod)):
            return [obj.__func__]
        if isinstance(obj, property):
            return [obj.fget, obj.fset, obj.fdel]
        if isinstance(obj, partial):
            return [obj.func, *obj.args, *obj.keywords.values()]
        if isinstance(obj, types.MethodType):
            return [obj.__func__]
        if callable(obj):
            return self._function_uses(obj)
        return ()

    def _function_uses(self, obj: Any) -> list[object]:
        func = inspect.unwrap(obj)  # asynccontextmanager, functools.wraps
        if not isinstance(func, types.FunctionType):
            wrapped = getattr(obj, "_get_wrapped_function", None)  # a pytest fixture
            func = wrapped() if wrapped is not None else None
            if not isinstance(func, types.FunctionType):
                return []
        if not _ours(func.__module__):
            return []
        uses: list[object] = []
        names: set[str] = set()
        for code in _code_objects(func.__code__):
            names.update(code.co_names)
            for text in _strings(code.co_consts):
                if _MODULE_NAME.fullmatch(text):
                    module = _import(text)  # ``python -m bench.x``: what it defines runs
                    if module is not None:
                        uses.extend(_module_contents(module))
        # Names the code loads: globals of its module, and (``mod.attr``, ``from mod import
        # attr`` in the body) attributes of the suite's modules it names.
        modules: list[types.ModuleType] = []
        for name in names:
            value = _import(name) if _MODULE_NAME.fullmatch(name) else func.__globals__.get(name)
            if isinstance(value, types.ModuleType):
                if _ours(value.__name__):
                    modules.append(value)
            elif value is not None:
                uses.append(value)
        for module in modules:  # grows: ``from tests.support import tsdb`` names a module
            for name in names:
                value = getattr(module, name, None)
                if value is None and hasattr(module, "__path__"):  # a submodule not yet imported
                    value = _import(f"{module.__name__}.{name}")
                if isinstance(value, types.ModuleType):
                    if _ours(value.__name__) and value not in modules:
                        modules.append(value)
                elif value is not None:
                    uses.append(value)
        uses.extend(cell.cell_contents for cell in func.__closure__ or () if _filled(cell))
        uses.extend(func.__defaults__ or ())
        uses.extend((func.__kwdefaults__ or {}).values())
        return uses


def _module_contents(module: types.ModuleType) -> list[object]:
    """The functions and classes a module defines (not those it imports)."""
    return [
        value
        for value in vars(module).values()
        if getattr(value, "__module__", None) == module.__name__
    ]


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def _import(name: str) -> types.ModuleType | None:
    try:
        if importlib.util.find_spec(name) is None:
            return None
        return importlib.import_module(name)
    except ImportError:
        return None
