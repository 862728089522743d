"""Reference tables rendered from the code, and the docs' copies of them kept in step.

Two kinds of block, each a Markdown table:

- ``config ROLE``: every key of the agent's, controller's or coordinator's config file, from
  the example shipped for that role (``powerd/data/ROLE.example.toml``): its key, the value
  it shows (a commented-out line shows a value that is not set) and its comment. The config
  tests hold each example to its loader: every key it knows documented, every value shown
  its default.
- ``cli PROG MODULE:ATTR``: every command of a click group (``powerd.cli:main``), with
  its usage, summary and options as ``--help`` gives them.

A doc holds a block between ``<!-- generated: powerd reference KIND ARGS -->`` and
``<!-- end generated -->``; the marker is the command that prints the block.
``powerd reference check`` lists the blocks that differ from what the code renders,
``powerd reference update`` rewrites them.
"""

from __future__ import annotations

import importlib
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import click

ROLES = ("agent", "controller", "coordinator")
BEGIN = "<!-- generated: powerd reference "
END = "<!-- end generated -->"
_BLOCK = re.compile(
    re.escape(BEGIN) + r"(?P<args>[^>]*?) -->\n(?P<body>.*?)" + re.escape(END), re.S
)
_SECTION = re.compile(r"^\[(?P<name>[A-Za-z0-9_.]+)\]\s*$")
_KEY = re.compile(r"^(?P<off>#\s*)?(?P<key>[A-Za-z0-9_]+) = (?P<value>.*)$")


class ReferenceError(ValueError):
    """A block that names nothing this module can render."""


@dataclass(frozen=True)
class ConfigKey:
    """One line of the reference: a key (``""`` for a section's own note) and its comment."""

    section: str
    key: str
    shown: str  # the value as the example writes it
    is_set: bool  # False: the example shows it commented out
    text: str


def example_text(role: str) -> str:
    if role not in ROLES:
        raise ReferenceError(f"no config role {role!r}; roles: {', '.join(ROLES)}")
    return resources.files("powerd.data").joinpath(f"{role}.example.toml").read_text("utf-8")


def _value(raw: str) -> str | None:
    """The TOML value at the start of ``raw`` (a comment may follow it), None if none is."""
    for end in range(len(raw), 0, -1):
        candidate = raw[:end].strip()
        try:
            tomllib.loads(f"k = {candidate}")
        except tomllib.TOMLDecodeError:
            continue
        return candidate
    return None


def config_keys(text: str) -> list[ConfigKey]:
    """The keys of an example config, each with the comment block just above it; a comment
    block that no key follows is its section's note, and a sub-table (``[failsafe.caps_w]``)
    is one key of its parent, its example entries its shown value."""
    keys: list[ConfigKey] = []
    section = ""
    table: list[str] | None = None  # the shown entries of the current sub-table
    comment: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        header = _SECTION.match(stripped)
        if header is not None:
            name = header["name"]
            table = None
            if "." in name:
                parent, _, child = name.rpartition(".")
                table = []
                keys.append(ConfigKey(parent, child, "", False, " ".join(comment)))
            else:
                section = name
            comment = []
            continue
        key = _KEY.match(stripped)
        value = _value(key["value"]) if key is not None else None
        if key is not None and value is not None and section:
            if table is not None:
                table.append(f"{key['key']} = {value}")
                keys[-1] = replace(keys[-1], shown="{" + ", ".join(table) + "}")
            else:
                set_ = key["off"] is None
                keys.append(ConfigKey(section, key["key"], value, set_, " ".join(comment)))
            comment = []
        elif stripped.startswith("#") and section:
            words = stripped.lstrip("#").strip()
            if words:
                comment.append(words)
        elif not stripped and comment and section and all(k.section != section for k in keys):
            keys.append(ConfigKey(section, "", "", False, " ".join(comment)))
            comment = []
    return keys


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def config_table(role: str) -> str:
    """The Markdown table of ``role``'s config keys."""
    rows = [
        f"Every key of `{role}.toml`, from `powerd/data/{role}.example.toml`; a value in"
        " parentheses is shown commented out there (not set unless its text says it is the"
        " default).",
        "",
        "| key | value | what |",
        "| --- | --- | --- |",
    ]
    for k in config_keys(example_text(role)):
        if not k.key:
            rows.append(f"| `[{k.section}]` | | {_cell(k.text)} |")
            continue
        shown = f"`{_cell(k.shown)}`" if k.is_set else f"(`{_cell(k.shown)}`)"
        rows.append(f"| `{k.section}.{k.key}` | {shown} | {_cell(k.text) or '(as above)'} |")
    return "\n".join(rows) + "\n"


def _commands(group: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    """Every command under ``group`` but the hidden ones (not for users: not in --help)."""
    yield path, group
    if isinstance(group, click.Group):
        for name in sorted(group.commands):
            if not group.commands[name].hidden:
                yield from _commands(group.commands[name], f"{path} {name}")


def _one_line(text: str) -> str:
    return _cell(" ".join(text.replace("\b", "").split()))


def _command_section(path: str, command: click.Command) -> list[str]:
    ctx = click.Context(command, info_name=path, max_content_width=100)
    usage = (
        ""
        if isinstance(command, click.Group)
        else " " + " ".join(command.collect_usage_pieces(ctx))
    )
    lines = [f"#### `{path}{usage}`", _one_line(command.get_short_help_str(limit=300)), ""]
    options = [
        record
        for param in command.get_params(ctx)
        if isinstance(param, click.Option)
        for record in [param.get_help_record(ctx)]
        if record is not None and "--help" not in record[0]
    ]
    if options:
        lines += ["| option | what |", "| --- | --- |"]
        lines += [f"| `{_cell(opt)}` | {_one_line(text)} |" for opt, text in options]
        lines.append("")
    return lines


def cli_reference(program: str, target: str) -> str:
    """Every command of the click group at ``target`` (``module:attribute``), as ``program``."""
    module_name, _, attribute = target.partition(":")
    try:
        group = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ReferenceError(f"cannot load {target}: {exc}") from None
    if not isinstance(group, click.Command):
        raise ReferenceError(f"{target} is not a click command")
    lines: list[str] = []
    for path, command in _commands(group, program):
        section = _command_section(path, command)
        # a subgroup with no options of its own is left out: its commands' headings name it
        if command is group or not isinstance(command, click.Group) or len(section) > 3:
            lines += section
    return "\n".join(lines).rstrip("\n") + "\n"


def render(args: str) -> str:
    """The block a marker's arguments name: ``config ROLE`` or ``cli PROG MODULE:ATTR``."""
    words = args.split()
    match words:
        case ["config", role]:
            return config_table(role)
        case ["cli", program, target]:
            return cli_reference(program, target)
    raise ReferenceError(f"unknown block {args!r}: config ROLE, or cli PROG MODULE:ATTR")


def refreshed(text: str) -> tuple[str, list[str]]:
    """``text`` with every generated block rendered anew, and the blocks that changed."""
    changed: list[str] = []

    def fresh(match: re.Match[str]) -> str:
        body = render(match["args"])
        if body != match["body"]:
            changed.append(match["args"])
        return f"{BEGIN}{match['args']} -->\n{body}{END}"

    return _BLOCK.sub(fresh, text), changed


def doc_files(root: Path) -> list[Path]:
    """The documents that may hold generated blocks: README.md and docs/*.md."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def stale_blocks(root: Path, *, write: bool = False) -> list[str]:
    """``FILE: BLOCK`` for each block under ``root`` that differs from what the code renders;
    with ``write``, those files are rewritten."""
    stale: list[str] = []
    for path in doc_files(root):
        text = path.read_text(encoding="utf-8")
        new, changed = refreshed(text)
        stale += [f"{path.relative_to(root)}: {args}" for args in changed]
        if write and changed:
            path.write_text(new, encoding="utf-8")
    return stale
