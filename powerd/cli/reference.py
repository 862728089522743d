"""``powerd reference``: the config and CLI reference tables, and the docs' copies of them
(powerd.reference does the work)."""

from __future__ import annotations

from pathlib import Path

import click

from powerd.reference import ROLES, ReferenceError, cli_reference, config_table, stale_blocks

_ROOT = click.option(
    "--root",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=".",
    help="The repository whose README.md and docs/*.md hold the blocks.",
)


@click.group(
    "reference",
    short_help="Print the config and CLI reference; check the docs' copies.",
    hidden=True,  # the maintainers' tool (docs/ARCHITECTURE.md), not in --help or REFERENCE.md
)
def group() -> None:
    """The reference tables the docs carry, rendered from the code: each role's config keys
    (from powerd/data/ROLE.example.toml) and every command and option of a click program.

    A doc holds a block between `<!-- generated: powerd reference ARGS -->` and
    `<!-- end generated -->`; `powerd reference ARGS` prints it.

    \b
    Examples:
      powerd reference config controller
      powerd reference cli powerplan planner.cli:main
      powerd reference check            # from the repository's root: exit 1 if a doc is stale
      powerd reference update           # rewrite the stale blocks
    """


@group.command("config", short_help="A role's config keys, as a Markdown table.")
@click.argument("role", type=click.Choice(ROLES))
def config(role: str) -> None:
    """Print ROLE's config keys as a Markdown table.

    \b
    Examples:
      powerd reference config agent
      powerd reference config coordinator > /tmp/coordinator-keys.md
    """
    click.echo(config_table(role), nl=False)


@group.command("cli", short_help="A click program's commands and options, as Markdown.")
@click.argument("program")
@click.argument("target", metavar="MODULE:ATTR")
def cli(program: str, target: str) -> None:
    """Print every command of the click group MODULE:ATTR, named PROGRAM, as Markdown.

    \b
    Examples:
      powerd reference cli powerd powerd.cli:main
      powerd reference cli powerplan planner.cli:main
    """
    try:
        click.echo(cli_reference(program, target), nl=False)
    except ReferenceError as exc:
        raise click.ClickException(str(exc)) from None


def _stale(root: Path, write: bool) -> list[str]:
    try:
        return stale_blocks(root, write=write)
    except ReferenceError as exc:
        raise click.ClickException(str(exc)) from None


@group.command("check", short_help="Exit 1 if a doc's generated block differs from the code.")
@_ROOT
def check(root: Path) -> None:
    """List the generated blocks of README.md and docs/*.md that differ from what the code
    renders; exit 1 if any does.

    \b
    Examples:
      powerd reference check                # from the repository's root
      powerd reference check --root ~/src/powerd
    """
    stale = _stale(root, write=False)
    for block in stale:
        click.echo(f"stale: {block}")
    if stale:
        raise click.ClickException("run `powerd reference update` to rewrite them")


@group.command("update", short_help="Rewrite the docs' generated blocks from the code.")
@_ROOT
def update(root: Path) -> None:
    """Rewrite the generated blocks of README.md and docs/*.md that differ from the code.

    \b
    Examples:
      powerd reference update               # from the repository's root
    """
    for block in _stale(root, write=True):
        click.echo(f"updated: {block}")
