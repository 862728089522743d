"""The ``powerplan`` command: capacity planning from measured power profiles.

Each subcommand lives in its own module (``planner/commands_*.py``) and is
registered here; this file only groups them.
"""

from __future__ import annotations

import click

from powerd import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="powerplan")
def main() -> None:
    """powerplan: size rack, row and site power budgets and static GPU caps from measurements.

    \b
    powerplan profiles  read power profiles (CSV, Parquet, line protocol, InfluxDB), summarise
    powerplan caps      the GPU power cap that maximises throughput inside a fixed site power
    powerplan size      topology + workload mix + profiles -> a budgets file for the controller
    powerplan whatif    replay profiles through the controller's policies at given budgets
    powerplan report    a Markdown or HTML report with plots

    The method, with its reasoning, is in docs/PLANNER.md.
    """


def _register() -> None:
    """Add every subcommand module that exists (they are built one by one)."""
    import importlib

    for name in ("profiles", "caps", "size", "whatif", "report"):
        try:
            module = importlib.import_module(f"planner.commands_{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"planner.commands_{name}":
                raise
            continue
        main.add_command(module.command, name)


_register()

if __name__ == "__main__":
    main()
