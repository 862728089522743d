"""What an optional part of powerd needs installed, and the message when it is not.

A GPU node installs the agent alone (``pip install powerd``): its core
dependencies are what the agent and the controller import. The recorder's
InfluxDB client, the planner's data stack and the demo's broker and terminal
view are extras (pyproject.toml); a command that needs one and does not find it
stops with the line to run, instead of a traceback.
"""

from __future__ import annotations

import importlib

# extra -> the distributions pyproject.toml lists for it (import names)
EXTRAS: dict[str, tuple[str, ...]] = {
    "recorder": ("influxdb_client",),
    "planner": ("pandas", "scipy", "pyarrow", "matplotlib", "rich"),
    "demo": ("amqtt", "rich", "matplotlib"),
    "torch": ("torch",),  # powerd.jobhook.attach_ddp, in the training job's environment
}


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says how to install it."""


def require(extra: str, what: str) -> None:
    """Raise MissingExtra naming ``extra`` unless every module it brings imports."""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise MissingExtra(
                f"{what} needs the '{extra}' extra ({module} is not installed: {exc}); "
                f"install it with: pip install 'powerd[{extra}]'"
            ) from None
