"""The ``powerplan`` subcommands, one module each (``planner/cli.py`` groups them).

This layer only parses arguments, calls the planner's modules (``planner/*.py``:
profiles, sizing, whatif, caps, report) and prints their results; ``options``
holds the click options several commands share.
"""
