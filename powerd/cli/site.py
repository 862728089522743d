"""``powerd site generate``: a site's whole configuration from its budgets file."""

from __future__ import annotations

import getpass
import time
from pathlib import Path

import click


@click.group("site", short_help="A site's configuration, from its budgets file, in one command.")
def group() -> None:
    """A site's configuration: broker, logins, TLS, keys, configs, units, monitoring.

    \b
    Examples:
      powerd site generate --budgets budgets.toml --cluster prod --broker-host mqtt.site \\
        --controller ctl-a.site --controller ctl-b.site --out site/
    """


@group.command("generate", short_help="Write every host's configuration under --out.")
@click.option(
    "--budgets",
    "budgets",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="The site's budgets file (docs/BUDGETS.md): its nodes get a login and a config each.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder to write into; run again on it to change the site: secrets are kept.",
)
@click.option("--cluster", default="default", help="Cluster name (topics powerd/v1/CLUSTER).")
@click.option(
    "--broker-host",
    "broker_hosts",
    multiple=True,
    required=True,
    help="The broker's host name or address, as clients reach it; repeatable (every one "
    "goes in its certificate, the first in the clients' URL).",
)
@click.option("--broker-port", default=8883, type=click.IntRange(1, 65535), help="TLS port.")
@click.option(
    "--controller",
    "controllers",
    multiple=True,
    required=True,
    help="A controller host: give two, a leader and its standby (same config, own names).",
)
@click.option(
    "--coordinator",
    help="The site coordinator's host: a tree of controllers, one leaf per row "
    "(powerd-controller@ROW on each controller host; agents follow their row).",
)
@click.option("--influx-url", help="InfluxDB the controllers record to: http(s)://HOST:8086.")
@click.option("--influx-org", default="powerd", help="InfluxDB 2.x organisation.")
@click.option("--influx-bucket", default="powerd", help="InfluxDB 2.x bucket (1.x: the database).")
@click.option("--influx-v1", is_flag=True, help="InfluxDB 1.x (no token; the bucket is a db).")
@click.option(
    "--ca-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The site's own CA certificate (PEM): it signs the broker's certificate.",
)
@click.option(
    "--ca-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="That CA's private key (PEM, unencrypted); read, never copied.",
)
@click.option(
    "--exec",
    "exec_path",
    default="/usr/local/bin/powerd",
    help="powerd on the hosts, for the units' ExecStart (not under /home or /tmp).",
)
@click.option(
    "--metrics-ports",
    default="9470,9471,9472",
    help="Agent, controller and coordinator /metrics ports (Prometheus targets).",
)
@click.option("--node-domain", default="", help="Domain appended to node names for Prometheus.")
@click.option(
    "--in-place",
    is_flag=True,
    help="Lab or test: configs name their files where they are written (not /etc), the "
    "broker keeps its data there and runs as this user.",
)
def generate(
    budgets: Path,
    out: Path,
    cluster: str,
    broker_hosts: tuple[str, ...],
    broker_port: int,
    controllers: tuple[str, ...],
    coordinator: str | None,
    influx_url: str | None,
    influx_org: str,
    influx_bucket: str,
    influx_v1: bool,
    ca_cert: Path | None,
    ca_key: Path | None,
    exec_path: str,
    metrics_ports: str,
    node_domain: str,
    in_place: bool,
) -> None:
    """Write a site's whole configuration under --out, from its budgets file.

    The broker (mosquitto.conf with a TLS listener, a password file with one login and
    random password per node and the service logins, the shipped ACL), a CA and the
    broker's certificate (or --ca-cert/--ca-key: your own CA signs it), each node's
    agent config, the controllers' (a leader and a standby) and a tree's coordinator's
    configs with their signing key, the operator's key and login, systemd units,
    Grafana provisioning and a Prometheus scrape config. INSTALL.txt says which folder
    goes to which host; docs/DEPLOY.md walks through it.

    Keys, passwords and the CA are made once, under OUT/secrets/: a second run keeps
    them (and says so), and writes every other file again.

    \b
    Examples:
      powerd site generate --budgets /etc/powerd/budgets.toml --cluster prod \\
        --broker-host mqtt.prod.example --controller ctl-a.prod.example \\
        --controller ctl-b.prod.example --influx-url http://influx.prod.example:8086 \\
        --influx-org ops --influx-bucket powerd --out prod-site/
      # a tree of controllers, your own CA:
      powerd site generate --budgets tree.toml --broker-host mqtt --controller ctl-a \\
        --controller ctl-b --coordinator coord --ca-cert ca.pem --ca-key ca.key --out site/
    """
    from powerd.site_config import SiteOptions, generate_site

    try:
        ports = [int(p) for p in metrics_ports.split(",")]
        if len(ports) != 3 or not all(1 <= p <= 65535 for p in ports):
            raise ValueError
    except ValueError:
        raise click.BadParameter(
            "three ports, AGENT,CONTROLLER,COORDINATOR (e.g. 9470,9471,9472)",
            param_hint="--metrics-ports",
        ) from None
    started = time.monotonic()
    try:
        options = SiteOptions(
            budgets=budgets,
            out=out,
            broker_hosts=broker_hosts,
            controllers=controllers,
            cluster=cluster,
            broker_port=broker_port,
            coordinator=coordinator,
            influx_url=influx_url,
            influx_org=influx_org,
            influx_bucket=influx_bucket,
            influx_v1=influx_v1,
            ca_cert=ca_cert,
            ca_key=ca_key,
            exec_path=exec_path,
            agent_metrics_port=ports[0],
            controller_metrics_port=ports[1],
            coordinator_metrics_port=ports[2],
            node_domain=node_domain,
            in_place=in_place,
            broker_user=getpass.getuser() if in_place else None,
        )
        site = generate_site(options)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    for what in site.kept:
        click.echo(f"kept {what}")
    for what in site.made:
        click.echo(f"made {what}")
    for note in site.notes:
        click.echo(f"note: {note}")
    elapsed_s = time.monotonic() - started
    click.echo(
        f"wrote the site's configuration for {site.nodes} nodes to {site.out} in "
        f"{elapsed_s:.1f} s: see {site.out / 'INSTALL.txt'}"
    )
