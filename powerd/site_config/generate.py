"""What goes where: ``generate_site`` writes a site's configuration under ``options.out``."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from policies.tree import ROW, SERVER
from powerd.grafana.dashboards import DASHBOARDS, render
from powerd.site_config import render as text
from powerd.site_config.mosquitto_passwd import password_file
from powerd.site_config.pki import broker_certificate, certificate_hosts, load_ca, make_ca
from powerd.site_config.secrets_store import SecretStore, write_file
from powerd.systemd import render_agent_unit, render_controller_unit, render_coordinator_unit
from powerd.topology import Topology, load_budgets

# The shipped ACL's service logins (powerd/data/mosquitto-acl.example): one password each.
SERVICE_LOGINS = (
    "powerd-controller",
    "powerd-coordinator",
    "powerd-operator",
    "powerd-reader",
    "powerd-fill",
)
PROMETHEUS_RULES = "prometheus/powerd-alerts.yml"  # in powerd.data, once shipped
GRAFANA_ALERTS = Path("grafana/provisioning/alerting/powerd-alerts.yaml")  # in a checkout
ETC = "/etc/powerd"
SECRET = 0o600


@dataclass(frozen=True)
class SiteOptions:
    """What the budgets file does not say: hosts, ports, where telemetry goes."""

    budgets: Path
    out: Path
    broker_hosts: tuple[str, ...]
    controllers: tuple[str, ...]
    cluster: str = "default"
    broker_port: int = 8883
    coordinator: str | None = None
    influx_url: str | None = None  # http(s)://HOST:8086
    influx_org: str = "powerd"
    influx_bucket: str = "powerd"  # the database, for InfluxDB 1.x
    influx_v1: bool = False
    ca_cert: Path | None = None
    ca_key: Path | None = None
    exec_path: str = "/usr/local/bin/powerd"
    agent_metrics_port: int = 9470
    controller_metrics_port: int = 9471
    coordinator_metrics_port: int = 9472
    node_domain: str = ""  # appended to node names for Prometheus targets
    in_place: bool = False  # configs name their files where they are generated (a lab, a test)
    broker_user: str | None = None  # in_place: the user the broker runs as

    def __post_init__(self) -> None:
        if not self.broker_hosts:
            raise ValueError("give the broker's host name (--broker-host)")
        if not 1 <= len(self.controllers) <= 2:
            raise ValueError("give one or two controller hosts (--controller): a leader, a standby")
        if len(set(self.controllers)) != len(self.controllers):
            raise ValueError("the controller hosts must differ")
        if (self.ca_cert is None) != (self.ca_key is None):
            raise ValueError("--ca-cert and --ca-key go together (the site's own CA)")


@dataclass
class GeneratedSite:
    """What a run wrote, and which secrets it kept or made."""

    out: Path
    nodes: int
    kept: list[str] = field(default_factory=list)
    made: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def short_name(host: str) -> str:
    return host.split(".", 1)[0]


def generate_site(options: SiteOptions) -> GeneratedSite:
    """Write every file of the site under ``options.out`` (secrets kept across runs)."""
    topology = load_budgets(options.budgets)
    out = options.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    store = SecretStore(out / "secrets")
    result = GeneratedSite(out, len(topology.servers))
    tree = options.coordinator is not None

    ca_pem, ca_key = _ca(options, store)
    broker_pem, broker_key = store.pem_pair(
        "broker",
        lambda: broker_certificate(options.broker_hosts, ca_pem, ca_key),
        "the broker's TLS key and certificate",
    )
    missing = set(options.broker_hosts) - set(certificate_hosts(broker_pem))
    if missing:
        result.notes.append(
            f"the kept broker certificate does not name {', '.join(sorted(missing))}: remove "
            f"{store.root}/broker.pem and broker.key and run again to issue a new one"
        )
    passwords = store.passwords([*SERVICE_LOGINS, *topology.servers])
    _broker(options, out, ca_pem, broker_pem, broker_key, passwords)
    site = _SiteFiles(
        options,
        out,
        ca_pem,
        passwords,
        f"mqtts://{options.broker_hosts[0]}:{options.broker_port}",
        store.key_pair("controller"),
        store.key_pair("operator"),
        store.key_pair("coordinator") if tree else None,
    )
    site.nodes(topology)
    site.controllers()
    site.coordinator()
    site.operator_and_jobs()
    _prometheus(options, out, topology, result)
    _grafana(options, out, result)
    write_file(out / "INSTALL.txt", _install(options, topology, site.url))
    result.kept, result.made = store.kept, store.made
    return result


@dataclass(frozen=True)
class _SiteFiles:
    """What every host's folder is written from: the CA, the logins' passwords, the
    broker's URL and the signing keys (each a private key and its public key's path)."""

    options: SiteOptions
    out: Path
    ca_pem: bytes
    passwords: dict[str, str]
    url: str
    controller_keys: tuple[Path, Path]
    operator_keys: tuple[Path, Path]
    coordinator_keys: tuple[Path, Path] | None

    def login(self, folder: Path, user: str) -> text.BrokerLogin:
        """``user``'s password file and the CA in ``folder``; the login that names them."""
        write_file(folder / "mqtt-password", self.passwords[user] + "\n", SECRET)
        write_file(folder / "ca.pem", self.ca_pem)
        etc = self.etc(folder)
        return text.BrokerLogin(self.url, user, f"{etc}/mqtt-password", f"{etc}/ca.pem")

    def etc(self, folder: Path) -> str:
        """Where ``folder``'s files are read from on its host."""
        return str(folder) if self.options.in_place else ETC

    def nodes(self, topology: Topology) -> None:
        options, tree = self.options, self.coordinator_keys is not None
        rows = _row_of(topology)
        for k, node in enumerate(topology.servers):
            folder = self.out / "nodes" / node
            broker = self.login(folder, node)
            write_file(
                folder / "agent.toml",
                text.agent_toml(
                    node,
                    options.cluster,
                    float(topology.server_failsafe_cap_w[k]),
                    broker,
                    f"0.0.0.0:{options.agent_metrics_port}",
                    rows[k] if tree else None,
                ),
            )
            shutil.copyfile(self.controller_keys[1], folder / "controller.pub")
            write_file(
                folder / "powerd-agent.service",
                render_agent_unit(options.exec_path, f"{self.etc(folder)}/agent.toml"),
            )

    def controllers(self) -> None:
        options, tree = self.options, self.coordinator_keys is not None
        recorder_url, token_file = _recorder(options)
        for host in options.controllers:
            folder = self.out / "controllers" / host
            etc = self.etc(folder)
            write_file(
                folder / "controller.toml",
                text.controller_toml(
                    short_name(host),
                    options.cluster,
                    self.login(folder, "powerd-controller"),
                    recorder_url,
                    f"{etc}/influx-token" if token_file else None,
                    f"0.0.0.0:{options.controller_metrics_port}",
                    tree,
                ),
            )
            write_file(folder / "controller.key", self.controller_keys[0].read_bytes(), SECRET)
            shutil.copyfile(self.controller_keys[1], folder / "controller.pub")
            shutil.copyfile(self.operator_keys[1], folder / "operator.pub")
            if self.coordinator_keys is not None:
                shutil.copyfile(self.coordinator_keys[1], folder / "coordinator.pub")
            shutil.copyfile(options.budgets, folder / "budgets.toml")
            unit = render_controller_unit(
                options.exec_path,
                f"{etc}/controller.toml",
                f"{etc}/budgets.toml",
                f"{etc}/controller.key",
                scoped=tree,
            )
            name = "powerd-controller@.service" if tree else "powerd-controller.service"
            write_file(folder / name, unit)

    def coordinator(self) -> None:
        options, keys = self.options, self.coordinator_keys
        if options.coordinator is None or keys is None:
            return
        folder = self.out / "coordinator" / options.coordinator
        etc = self.etc(folder)
        write_file(
            folder / "coordinator.toml",
            text.coordinator_toml(
                short_name(options.coordinator),
                options.cluster,
                self.login(folder, "powerd-coordinator"),
                f"0.0.0.0:{options.coordinator_metrics_port}",
            ),
        )
        write_file(folder / "coordinator.key", keys[0].read_bytes(), SECRET)
        for pub in (self.controller_keys[1], self.operator_keys[1]):
            shutil.copyfile(pub, folder / pub.name)
        shutil.copyfile(options.budgets, folder / "budgets.toml")
        write_file(
            folder / "powerd-coordinator.service",
            render_coordinator_unit(
                options.exec_path,
                f"{etc}/coordinator.toml",
                f"{etc}/budgets.toml",
                f"{etc}/coordinator.key",
            ),
        )

    def operator_and_jobs(self) -> None:
        folder = self.out / "operator"
        self.login(folder, "powerd-operator")
        write_file(folder / "operator.key", self.operator_keys[0].read_bytes(), SECRET)
        shutil.copyfile(self.controller_keys[1], folder / "controller.pub")
        if self.coordinator_keys is not None:
            shutil.copyfile(self.coordinator_keys[1], folder / "coordinator.pub")
        jobs = self.out / "jobs"
        write_file(jobs / "fill-password", self.passwords["powerd-fill"] + "\n", 0o640)
        write_file(jobs / "ca.pem", self.ca_pem)


def _ca(options: SiteOptions, store: SecretStore) -> tuple[bytes, bytes]:
    if options.ca_cert is not None and options.ca_key is not None:
        pem, key = options.ca_cert.read_bytes(), options.ca_key.read_bytes()
        load_ca(pem, key)  # ValueError when they do not belong together
        return pem, key
    return store.pem_pair("ca", lambda: make_ca(f"powerd {options.cluster} CA"), "the site CA")


def _broker(
    options: SiteOptions,
    out: Path,
    ca_pem: bytes,
    broker_pem: bytes,
    broker_key: bytes,
    passwords: dict[str, str],
) -> None:
    folder = out / "broker"
    here = options.in_place
    certs = folder / "certs" if here else Path("/etc/mosquitto/certs")
    write_file(folder / "certs" / "ca.pem", ca_pem)
    write_file(folder / "certs" / "broker.crt", broker_pem)
    write_file(folder / "certs" / "broker.key", broker_key, SECRET)
    write_file(folder / "passwd", password_file(passwords), SECRET)
    acl = resources.files("powerd.data").joinpath("mosquitto-acl.example").read_text()
    write_file(folder / "powerd-acl", acl)
    data = folder / "data" if here else Path("/var/lib/mosquitto")
    if here:
        data.mkdir(parents=True, exist_ok=True)
    write_file(
        folder / "mosquitto.conf",
        text.mosquitto_conf(
            options.broker_port,
            str(certs),
            str(folder / "passwd") if here else "/etc/mosquitto/passwd",
            str(folder / "powerd-acl") if here else "/etc/mosquitto/powerd-acl",
            str(data),
            options.broker_user if here else None,
        ),
    )


def _row_of(topology: Topology) -> list[str]:
    """Each server's row name, in server order."""
    names, parent, level = topology.names, topology.parent, topology.level
    rows = []
    for k in range(topology.level_start[SERVER], topology.level_start[SERVER + 1]):
        i = k
        while level[i] != ROW:
            i = int(parent[i])
        rows.append(names[i])
    return rows


def _recorder(options: SiteOptions) -> tuple[str | None, bool]:
    """The controllers' recorder URL, and whether they need a token file."""
    if options.influx_url is None:
        return None, False
    base = options.influx_url.rstrip("/")
    scheme, sep, rest = base.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"--influx-url {options.influx_url!r}: give http(s)://HOST:PORT")
    if options.influx_v1:
        return f"influx1+{scheme}://{rest}?db={options.influx_bucket}", False
    query = f"org={options.influx_org}&bucket={options.influx_bucket}"
    return f"influx+{scheme}://{rest}?{query}", True


def _prometheus(options: SiteOptions, out: Path, topology: Topology, result: GeneratedSite) -> None:
    folder = out / "prometheus"
    suffix = f".{options.node_domain}" if options.node_domain else ""
    agents = [
        (f"{node}{suffix}:{options.agent_metrics_port}", {"cluster": options.cluster})
        for node in topology.servers
    ]
    controllers = [
        (f"{host}:{options.controller_metrics_port}", {"cluster": options.cluster})
        for host in options.controllers
    ]
    coordinators = (
        [
            (
                f"{options.coordinator}:{options.coordinator_metrics_port}",
                {"cluster": options.cluster},
            )
        ]
        if options.coordinator
        else []
    )
    for role, targets in (
        ("agent", agents),
        ("controller", controllers),
        ("coordinator", coordinators),
    ):
        write_file(folder / "targets" / f"{role}s.json", text.file_sd(targets))
    rules = resources.files("powerd.data").joinpath(PROMETHEUS_RULES)
    rules_name = None
    if rules.is_file():
        write_file(folder / "powerd-alerts.yml", rules.read_bytes())
        rules_name = "/etc/prometheus/powerd-alerts.yml"
    else:
        result.notes.append("no alert rules shipped with this powerd: prometheus.yml has none")
    write_file(folder / "prometheus.yml", text.prometheus_yml("/etc/prometheus/powerd", rules_name))


def _grafana(options: SiteOptions, out: Path, result: GeneratedSite) -> None:
    folder = out / "grafana"
    if options.influx_url:
        write_file(
            folder / "provisioning" / "datasources" / "powerd.yaml",
            text.grafana_datasource(
                options.influx_url.rstrip("/"), options.influx_bucket, options.influx_v1
            ),
        )
    provider = Path(__file__).parents[2] / "grafana/provisioning/dashboards/powerd.yaml"
    if provider.is_file():
        write_file(folder / "provisioning" / "dashboards" / "powerd.yaml", provider.read_bytes())
    for name, build in DASHBOARDS.items():
        write_file(folder / "dashboards" / name, render(build))
    alerts = Path(__file__).parents[2] / GRAFANA_ALERTS
    if alerts.is_file():
        write_file(folder / "provisioning" / "alerting" / "powerd-alerts.yaml", alerts.read_bytes())
    else:
        result.notes.append(
            "no Grafana alert rules found (grafana/provisioning/alerting/ of a checkout): "
            "none written"
        )


def _install(options: SiteOptions, topology: Topology, url: str) -> str:
    tree = options.coordinator is not None
    ctl_unit = "powerd-controller@.service" if tree else "powerd-controller.service"
    enable_ctl = (
        " ".join(f"powerd-controller@{row}" for row in topology.rows)
        if tree
        else "powerd-controller"
    )
    lines = [
        f"powerd site {options.cluster}: {len(topology.servers)} nodes, broker {url}.",
        "Generated by `powerd site generate`; docs/DEPLOY.md walks through each step.",
        "Copy each folder to its host, keeping modes (rsync -a / cp -a); secrets/ stays here.",
        "",
        f"broker/ -> {options.broker_hosts[0]} (apt-get install mosquitto):",
        "  mosquitto.conf -> /etc/mosquitto/mosquitto.conf",
        "  passwd, powerd-acl -> /etc/mosquitto/ (owner mosquitto, passwd mode 0600)",
        "  certs/ -> /etc/mosquitto/certs/ (broker.key owner mosquitto, mode 0600)",
        "  systemctl restart mosquitto",
        "",
        "nodes/NODE/ -> /etc/powerd/ on NODE (every file; mqtt-password stays 0600 root):",
        "  powerd-agent.service -> /etc/systemd/system/ ; systemctl enable --now powerd-agent",
        "",
    ]
    for host in options.controllers:
        lines += [
            f"controllers/{host}/ -> /etc/powerd/ on {host} (controller.key stays 0600 root):",
            f"  {ctl_unit} -> /etc/systemd/system/ ; systemctl enable --now {enable_ctl}",
        ]
    if tree:
        lines += [
            f"coordinator/{options.coordinator}/ -> /etc/powerd/ on {options.coordinator}:",
            "  powerd-coordinator.service -> /etc/systemd/system/ ;"
            " systemctl enable --now powerd-coordinator",
        ]
    if options.influx_url and not options.influx_v1:
        lines.append("  and the InfluxDB write token -> /etc/powerd/influx-token (mode 0600)")
    trust = "coordinator.pub" if tree else "controller.pub"
    lines += [
        "",
        "operator/ -> each operator (operator.key is the signing key for site limits):",
        "  POWERD_MQTT_PASSWORD=$(cat mqtt-password) powerd limit set --site 10MW --for 15m \\",
        f"    --key operator.key --trust {trust} \\",
        f"    --broker mqtts://powerd-operator@{options.broker_hosts[0]}:{options.broker_port}",
        "  (with SSL_CERT_FILE=ca.pem, or ca.pem in the system's CA store)",
        "",
        "jobs/ -> the nodes' job environment: fill-password (group-readable by job users)",
        "  and ca.pem, for FillFollower's login powerd-fill (docs/JOBHOOK.md).",
        "",
        "prometheus/ -> the Prometheus host: prometheus.yml -> /etc/prometheus/,",
        "  targets/ -> /etc/prometheus/powerd/, powerd-alerts.yml -> /etc/prometheus/.",
        "grafana/ -> the Grafana host: provisioning/ -> /etc/grafana/provisioning/,",
        "  dashboards/ -> /var/lib/grafana/dashboards/powerd/.",
        "",
        "secrets/ keeps every key, password and the CA: back it up, keep it off the hosts;",
        "running the generator again on this folder keeps them.",
    ]
    return "\n".join(lines) + "\n"
