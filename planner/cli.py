"""The ``powerplan`` command: capacity planning from measured power profiles.

Each subcommand lives in its own module (``planner/commands/*.py``); this file
only groups them. ``powerplan --help`` lists them from the group itself (click's
Commands section, each command's ``short_help``), so the list cannot drift.
"""

from __future__ import annotations

import click

from planner.commands.caps import command as caps_command
from planner.commands.clocks import command as clocks_command
from planner.commands.evaluate import command as evaluate_command
from planner.commands.frontier import command as frontier_command
from planner.commands.profiles import command as profiles_command
from planner.commands.report import command as report_command
from planner.commands.rhythm import command as rhythm_command
from planner.commands.size import command as size_command
from planner.commands.whatif import command as whatif_command
from powerd import __version__


@click.group(
    context_settings={
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
        "show_default": True,  # every subcommand's options show their defaults
    }
)
@click.version_option(__version__, prog_name="powerplan")
def main() -> None:
    """powerplan: size rack, row and site power budgets and static GPU caps from measurements.

    Commands lists every subcommand; `powerplan COMMAND --help` explains one,
    with examples that run from the repository's root. The method, with its
    reasoning, is in docs/PLANNER.md.

    \b
    Examples:
      powerplan profiles tests/data/profiles/train.csv
      powerplan caps tests/data/zeus-power-limit/summary_power_a40.csv --overhead-w 360
      powerplan size --help
    """


main.add_command(profiles_command, "profiles")
main.add_command(caps_command, "caps")
main.add_command(size_command, "size")
main.add_command(whatif_command, "whatif")
main.add_command(report_command, "report")
main.add_command(rhythm_command, "rhythm")
main.add_command(clocks_command, "clocks")
main.add_command(evaluate_command, "evaluate")
main.add_command(frontier_command, "frontier")

if __name__ == "__main__":
    main()
