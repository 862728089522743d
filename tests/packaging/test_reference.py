"""The reference tables (powerd.reference): rendered from the code, and the docs' copies
of them the same, so a new key or option cannot be missing from the docs."""

from __future__ import annotations

import tomllib

import click
import pytest
from click.testing import CliRunner

from powerd.cli import main as powerd_main
from powerd.reference import (
    BEGIN,
    END,
    ROLES,
    ConfigKey,
    ReferenceError,
    cli_reference,
    config_keys,
    config_table,
    doc_files,
    example_text,
    refreshed,
    render,
    stale_blocks,
)
from tests.support.paths import REPO

REGENERATE = "run `.venv/bin/powerd reference update` from the repository's root"


def test_the_docs_generated_blocks_are_what_the_code_renders() -> None:
    assert stale_blocks(REPO) == [], REGENERATE


def test_the_docs_carry_every_role_and_both_programs() -> None:
    text = "".join(p.read_text(encoding="utf-8") for p in doc_files(REPO))
    for role in ROLES:
        assert f"{BEGIN}config {role} -->" in text, role
    assert f"{BEGIN}cli powerd powerd.cli:main -->" in text
    assert f"{BEGIN}cli powerplan planner.cli:main -->" in text


EXAMPLE = """\
# a file's own header: no section yet
[top]
# What the section is for.

# A key that is set.
# Two lines of it.
a_s = 1.0
b_s = 2.0

# Not set here.
# c = "x"   (a remark after the value)

[top.table]
# 0 = 5.0
# 1 = 6.0
"""


def test_config_keys_read_comments_values_and_sub_tables() -> None:
    assert config_keys(EXAMPLE) == [
        ConfigKey("top", "", "", False, "What the section is for."),
        ConfigKey("top", "a_s", "1.0", True, "A key that is set. Two lines of it."),
        ConfigKey("top", "b_s", "2.0", True, ""),
        ConfigKey("top", "c", '"x"', False, "Not set here."),
        ConfigKey("top", "table", "{0 = 5.0, 1 = 6.0}", False, ""),
    ]


@pytest.mark.parametrize("role", ROLES)
def test_each_role_table_lists_every_key_its_example_sets(role: str) -> None:
    table = config_table(role)
    for section, keys in tomllib.loads(example_text(role)).items():
        for key in keys:
            assert f"| `{section}.{key}` |" in table, f"{role}: {section}.{key}"


def test_every_command_and_option_is_in_the_cli_reference() -> None:
    text = cli_reference("powerd", "powerd.cli:main")

    def walk(command: click.Command, path: str) -> None:
        assert f"#### `{path}" in text, path
        for param in command.params:
            if isinstance(param, click.Option):
                assert f"`{param.opts[0]}" in text or f", {param.opts[0]}" in text, param.opts
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                if sub.hidden:  # the maintainers' `powerd reference`: not for users
                    assert f"#### `{path} {name}" not in text
                else:
                    walk(sub, f"{path} {name}")

    walk(powerd_main, "powerd")
    # a subgroup with no options of its own gets no section: its commands' headings name it
    assert "#### `powerd keys`\n" not in text and "#### `powerd keys generate" in text
    assert "#### `powerd`\n" in text  # the program itself keeps its (--version)


def test_a_block_is_rewritten_between_its_markers_and_nothing_else() -> None:
    body = render("config coordinator")
    text = f"before\n{BEGIN}config coordinator -->\nold\n{END}\nafter\n"
    new, changed = refreshed(text)
    assert new == f"before\n{BEGIN}config coordinator -->\n{body}{END}\nafter\n"
    assert changed == ["config coordinator"]
    assert refreshed(new) == (new, [])


@pytest.mark.parametrize("args", ["config nobody", "cli x nowhere.module:main", "table x"])
def test_a_block_naming_nothing_is_an_error(args: str) -> None:
    with pytest.raises(ReferenceError):
        render(args)


def test_the_command_prints_a_block_and_checks_a_tree(tmp_path) -> None:
    runner = CliRunner()
    printed = runner.invoke(powerd_main, ["reference", "config", "agent"])
    assert printed.exit_code == 0 and printed.output == config_table("agent")
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "X.md"
    doc.write_text(f"{BEGIN}config agent -->\nstale\n{END}\n", encoding="utf-8")
    checked = runner.invoke(powerd_main, ["reference", "check", "--root", str(tmp_path)])
    assert checked.exit_code == 1 and "stale: docs/X.md: config agent" in checked.output
    assert "powerd reference update" in checked.output
    updated = runner.invoke(powerd_main, ["reference", "update", "--root", str(tmp_path)])
    assert updated.exit_code == 0
    assert (
        runner.invoke(powerd_main, ["reference", "check", "--root", str(tmp_path)]).exit_code == 0
    )
