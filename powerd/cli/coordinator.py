"""``powerd coordinator``: the site coordinator of a tree of controllers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from powerd.cli.options import (
    broker_option,
    budgets_option,
    cluster_option,
    config_option,
    log_level_option,
    metrics_listen_option,
    setup_logging,
    signing_key_option,
)
from powerd.click_types import Quantity
from powerd.configfile import ConfigError


@click.command(
    "coordinator",
    short_help="The site coordinator of a tree of (--scope) controllers: grants their budgets.",
)
@config_option("Coordinator config file (TOML). Without it: defaults (broker mqtt://localhost).")
@budgets_option("The site's budgets file (TOML, docs/BUDGETS.md), the one the leaves load.")
@broker_option()
@cluster_option()
@click.option("--name", help="This coordinator's name [default: short hostname].")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    metavar="ROW|NAME:ROW,ROW",
    help="A leaf controller's scope, as its --scope; repeat for each leaf. Together they "
    "must cover every row once [default: coordinator.scopes, else one leaf per row].",
)
@click.option("--period-s", type=Quantity("s"), help="Grant period [default: 5].")
@click.option("--grant-ttl-s", type=Quantity("s"), help="How long a grant holds [default: 15].")
@click.option(
    "--takeover-after-s",
    type=Quantity("s"),  # the config checks the ranges
    help="A standby leads once the leader is silent this long [default: 8]; with a period, "
    "under --grant-ttl-s.",
)
@signing_key_option(
    "The coordinator's private key (PEM; `powerd keys generate`): grants and heartbeats "
    "are signed with it. Replaces trust.signing_key."
)
@click.option(
    "--trust",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Public key (PEM) of the leaf controllers, the only keys whose summaries count; "
    "repeatable. Replaces trust.controller_keys.",
)
@metrics_listen_option(9472)
@log_level_option()
def command(
    config_path: Path | None,
    budgets_path: Path,
    broker: str | None,
    cluster: str | None,
    name: str | None,
    scopes: tuple[str, ...],
    period_s: float | None,
    grant_ttl_s: float | None,
    takeover_after_s: float | None,
    signing_key: Path | None,
    trust: tuple[Path, ...],
    metrics_listen: str | None,
    log_level: str,
) -> None:
    """Run the site coordinator of a tree of controllers.

    Leaf controllers (`powerd controller --scope`) each manage a row or a few
    rows and report a summary every cycle: measured and predicted power, and
    by priority class what their GPUs draw and what those held at their caps
    would draw more. Every period the coordinator divides the site's budget
    among them, high-priority watts anywhere before normal, normal before low,
    splits the site's ramp limit, and sends each leaf a signed grant valid
    --grant-ttl-s. A leaf that hears no grant for that long holds the lower of
    its grant and its file budget for as long again, then its file budget.

    A second coordinator with the same settings is a standby: it takes over
    when the leader goes silent (coordinator.takeover_after_s, default 8 s),
    before the leaves' grants expire.

    \b
    Examples:
      powerd coordinator --config /etc/powerd/coordinator.toml --budgets /etc/powerd/site.toml
      powerd keys generate /tmp/coord && powerd coordinator --signing-key /tmp/coord.key \\
        --budgets powerd/data/budgets/tree-3rows.toml --trust /tmp/ctl.pub \\
        --scope row1 --scope row2 --scope row3 --broker mqtt://localhost
    """
    from powerd.coordinator.app import run_coordinator
    from powerd.coordinator.config import load_coordinator_config
    from powerd.topology import BudgetError

    setup_logging(log_level)
    try:
        config = load_coordinator_config(config_path).with_overrides(
            broker=broker,
            cluster=cluster,
            name=name,
            scopes=scopes or None,
            period_s=period_s,
            grant_ttl_s=grant_ttl_s,
            takeover_after_s=takeover_after_s,
            signing_key=None if signing_key is None else str(signing_key),
            controller_keys=tuple(str(p) for p in trust) or None,
            metrics_listen=metrics_listen,
        )
        config.heartbeat_verifier(config.signer())  # unusable keys, or one in two roles
        config.summary_verifier()  # no leaf key, or an unreadable one: stop here, named
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        asyncio.run(run_coordinator(config, budgets_path))
    except (BudgetError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
