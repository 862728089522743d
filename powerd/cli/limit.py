"""``powerd limit``: an operator's temporary site limit (demand response), signed, retained."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import click

from powerd.cli.options import (
    broker_option,
    cluster_option,
    log_level_option,
    setup_logging,
    trust_option,
)
from powerd.click_types import Decorator, Quantity
from powerd.units import SECONDS_PER, WATTS_PER, split_quantity


def parse_power_w(text: str) -> float:
    """``120MW``, ``95000 kW``, ``800W`` -> watts (ValueError otherwise)."""
    parsed = split_quantity(text, WATTS_PER)
    if parsed is None or not parsed[1]:
        raise ValueError(f"{text!r}: give a power with its unit, e.g. 120MW, 95000kW")
    if parsed[0] <= 0:
        raise ValueError(f"{text!r}: a site limit must be above 0 W")
    return parsed[0]


def parse_duration_s(text: str) -> float:
    """``15m``, ``900s``, ``1.5h``, ``90`` (seconds) -> seconds (ValueError otherwise)."""
    parsed = split_quantity(text, SECONDS_PER)
    if parsed is None:
        raise ValueError(f"{text!r}: give a duration, e.g. 15m, 900s, 1h")
    return parsed[0]


@click.group("limit", short_help="An operator's temporary site limit (demand response), signed.")
def group() -> None:
    """An operator's temporary site limit (demand response).

    The site's controller (or, in a tree of controllers, the coordinator)
    takes a limit only when signed by a key in its trust.operator_keys,
    brings the site under it no faster than the site's ramp limit, holds it
    until it expires, then gives the budgets file's back. docs/CONTROLLER.md,
    "Demand response". Unlike other options, --site and --for take their unit
    in the value (120MW, 15m).

    Each command waits (--wait-s) until the leader's state (retained, signed)
    says it holds this very message, and exits 0; it exits 1 with the leader's
    reason when the leader refused it, when the broker refused the publish
    (MQTT v5 "Not authorized": the ACL), or when no leader answered in time.

    \b
    Examples:
      powerd keys generate /etc/powerd/operator      # its .pub in trust.operator_keys
      powerd limit set --site 120MW --for 15m --key /etc/powerd/operator.key
      powerd limit clear --key /etc/powerd/operator.key
    """


def _options(command: Callable[..., None]) -> Callable[..., None]:
    """The options both subcommands take: the key, who, where."""
    options: list[Decorator] = [
        click.option(
            "--key",
            "key_path",
            required=True,
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help="The operator's private key (PEM; `powerd keys generate`).",
        ),
        click.option(
            "--operator",
            default="operator",
            show_default=True,
            help="Who sets it (a name, in the logs).",
        ),
        click.option(
            "--wait-s",
            type=Quantity("s", min=0),
            default=15.0,
            show_default=True,
            help="How long to wait for the leader's confirmation (0: do not wait).",
        ),
        trust_option(
            "the confirmation counts only if signed by one of these", "unverified, said so"
        ),
        broker_option("mqtt://localhost"),
        cluster_option("default"),
        log_level_option(),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@group.command("set", short_help="Set a temporary site limit, signed.")
@click.option(
    "--site",
    "site",
    required=True,
    metavar="POWER",
    help="The limit, with its unit: 120MW, 95000kW, 800W.",
)
@click.option(
    "--for",
    "duration",
    required=True,
    metavar="DURATION",
    help="How long it holds, with its unit: 15m, 900s, 1.5h (a bare number: seconds).",
)
@click.option(
    "--start-in",
    default="0s",
    show_default=True,
    metavar="DURATION",
    help="When it starts, from now, as --for.",
)
@click.option(
    "--reason",
    default="",
    show_default=False,
    help="Why, for the logs (e.g. the utility's event id) [default: none].",
)
@_options
def set_limit(
    site: str,
    duration: str,
    start_in: str,
    reason: str,
    key_path: Path,
    operator: str,
    wait_s: float,
    trust_paths: tuple[Path, ...],
    broker: str | None,
    cluster: str | None,
    log_level: str,
) -> None:
    """Set a temporary site limit, signed with the operator's key, and wait for the
    leader to confirm it.

    \b
    Examples:
      powerd limit set --site 120MW --for 15m --key /etc/powerd/operator.key
      powerd limit set --site 95000kW --for 1h --start-in 10m --reason 'utility event 4711' \\
        --key /etc/powerd/operator.key --broker mqtts://powerd-operator@site-broker \\
        --trust /etc/powerd/controller.pub
    """
    setup_logging(log_level)
    try:
        limit_w = parse_power_w(site)
        starts = time.time() + parse_duration_s(start_in)
        expires = starts + parse_duration_s(duration)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    start, end = (time.strftime("%H:%M:%S", time.localtime(t)) for t in (starts, expires))
    what = f"site limit of {limit_w / 1e3:,.1f} kW from {start} until {end}"
    _publish(key_path, operator, broker, cluster, limit_w, starts, expires, reason,
             wait_s, trust_paths, what)  # fmt: skip


@group.command("clear", short_help="Clear the site limit now.")
@click.option("--reason", default="", show_default=False, help="Why, for the logs [default: none].")
@_options
def clear_limit(
    reason: str,
    key_path: Path,
    operator: str,
    wait_s: float,
    trust_paths: tuple[Path, ...],
    broker: str | None,
    cluster: str | None,
    log_level: str,
) -> None:
    """Clear the site limit now: the budgets file's bands return. Waits for the leader
    to confirm it, as `set`.

    \b
    Examples:
      powerd limit clear --key /etc/powerd/operator.key --reason 'event over'
    """
    setup_logging(log_level)
    now = time.time()
    _publish(key_path, operator, broker, cluster, None, now, now + 1.0, reason,
             wait_s, trust_paths, "site limit clear")  # fmt: skip


def _publish(
    key_path: Path,
    operator: str,
    broker: str | None,
    cluster: str | None,
    limit_w: float | None,
    starts: float,
    expires: float,
    reason: str,
    wait_s: float,
    trust_paths: tuple[Path, ...],
    what: str,
) -> None:
    """Sign, publish and (``wait_s`` > 0) wait for the leader's word; ClickException (exit
    1) unless confirmed."""
    from powerd.mqtt.url import parse_broker_url
    from powerd.protocol import ProtocolError, SiteLimit, Topics, encode
    from powerd.signing import KeyFileError, load_signer, load_verifier
    from powerd.vocabulary import PROTOCOL_VERSION

    try:
        signer = load_signer(key_path)
        verifier = load_verifier(trust_paths) if trust_paths else None
        topics = Topics(cluster or "default")
        settings = parse_broker_url(broker or "mqtt://localhost")
        now = time.time()
        message = SiteLimit(
            v=PROTOCOL_VERSION, operator=operator, seq=int(now * 1000), ts=now, limit_w=limit_w,
            starts_ts=starts, expires_ts=expires, reason=reason,
        )  # fmt: skip
        payload = signer.sign(topics.site_limit, encode(message))
        kwargs = settings.client_kwargs()
    except (KeyFileError, ProtocolError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    from powerd.cli.limit_wait import Outcome, send_and_wait

    try:
        outcome: Outcome = asyncio.run(
            send_and_wait(kwargs, topics, payload, message, wait_s, verifier)
        )
    except Exception as exc:  # any failure to reach the broker: say which and why
        raise click.ClickException(f"broker {settings.display}: {exc}") from None
    key_id = signer.trusted().key_id
    click.echo(outcome.text(what, settings.display, topics.site_limit, key_id), err=not outcome.ok)
    if not outcome.ok:
        raise SystemExit(1)
