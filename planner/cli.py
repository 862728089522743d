"""The ``powerplan`` command: capacity planning from measured power profiles.

Each subcommand lives in its own module (``planner/commands/*.py``); this file
only groups them.
"""

from __future__ import annotations

import click

from planner.commands.caps import command as caps_command
from planner.commands.profiles import command as profiles_command
from planner.commands.report import command as report_command
from planner.commands.rhythm import command as rhythm_command
from planner.commands.size import command as size_command
from planner.commands.whatif import command as whatif_command
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
    powerplan report    a Markdown or HTML report with plots on a budgets file
    powerplan rhythm    the profile of a synchronous training job, phase by phase

    The method, with its reasoning, is in docs/PLANNER.md.
    """


main.add_command(profiles_command, "profiles")
main.add_command(caps_command, "caps")
main.add_command(size_command, "size")
main.add_command(whatif_command, "whatif")
main.add_command(report_command, "report")
main.add_command(rhythm_command, "rhythm")

if __name__ == "__main__":
    main()
