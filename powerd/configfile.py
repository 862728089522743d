"""Reading powerd's TOML config files: errors that name the file and the key.

Shared by the agent's, the controller's and the coordinator's configs, so all
spell a broker, a key file, a typo or a wrong type the same way.
"""

from __future__ import annotations

import math
import os
import stat
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from powerd.metrics.address import parse_listen
from powerd.mqtt.url import BrokerSettings, parse_broker_url
from powerd.signing import (
    KeyFileError,
    RoleKeys,
    Signer,
    TrustedKey,
    Verifier,
    check_roles,
    load_signer,
    load_trusted_key,
    load_verifier,
)

BROKER_KEYS = frozenset(
    {
        "url",
        "username",
        "password_file",
        "ca_file",
        "cert_file",
        "key_file",
        "keepalive_s",
        "reconnect_min_s",
        "reconnect_max_s",
    }
)


class ConfigError(ValueError):
    """A configuration that cannot be used; the message says where and why."""


class _WithBroker(Protocol):
    @property
    def broker(self) -> BrokerSettings: ...


C = TypeVar("C", bound=_WithBroker)


def with_overrides(config: C, overrides: dict[str, Any], validate: Callable[[C, str], None]) -> C:
    """``config`` with the command line's overrides (None: not given; ``broker`` a URL read
    on top of the configured broker), validated again."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(given.get("broker"), str):
        try:
            given["broker"] = parse_broker_url(given["broker"], base=config.broker)
        except ValueError as exc:
            raise ConfigError(f"--broker: {exc}") from None
    updated = replace(config, **given)  # type: ignore[type-var]  # (C is a dataclass)
    validate(updated, "command line")
    return updated


def signer_from(path: str | None, source: str, missing: str) -> Signer:
    """The signing key at ``path``; ConfigError naming the file, or saying ``missing``."""
    if not path:
        raise ConfigError(f"{source}: {missing}")
    try:
        return load_signer(path)
    except KeyFileError as exc:
        raise ConfigError(f"{source}: trust.signing_key: {exc}") from None


def verifier_or_none(paths: Iterable[str], source: str, key: str) -> Verifier | None:
    """A verifier of the public keys at ``paths`` (config key ``key``); None when there are
    none (the messages only those keys may sign are then all refused)."""
    paths = tuple(paths)
    return verifier_from(paths, source, key) if paths else None


def verifier_from(paths: Iterable[str], source: str, key: str, *also: TrustedKey) -> Verifier:
    """A verifier of the public keys at ``paths`` (config key ``key``) and ``also``."""
    try:
        return load_verifier(paths, *also)
    except KeyFileError as exc:
        raise ConfigError(f"{source}: {key}: {exc}") from None


def check_key_roles(
    source: str, signer: Signer, role: str, trusted: Iterable[tuple[str, str, Iterable[str]]]
) -> None:
    """ConfigError when one public key is configured in two roles: among the ``trusted``
    entries (role, config key, paths), or this process's own key (``signer``, of ``role``)
    trusted for another role (``powerd.signing.check_roles``)."""
    entries = [RoleKeys(role, "trust.signing_key", (signer.trusted(),))]
    for entry_role, key, paths in trusted:
        try:
            keys = tuple(load_trusted_key(path) for path in paths)
        except KeyFileError as exc:
            raise ConfigError(f"{source}: {key}: {exc}") from None
        entries.append(RoleKeys(entry_role, key, keys))
    try:
        check_roles(entries)
    except KeyFileError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def read_toml(path: str | Path, known: dict[str, Any]) -> dict[str, Any]:
    """Parse a TOML file whose top-level tables and their keys must be in ``known``."""
    where = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    for section, value in raw.items():
        if section not in known:
            raise ConfigError(f"{where}: unknown section [{section}]; known: {sorted(known)}")
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: [{section}] must be a table")
        unknown = set(value) - set(known[section])
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {sorted(unknown)} in [{section}]; "
                f"known: {sorted(known[section])}"
            )
    return raw


class Getter:
    """Typed reads from a TOML table with errors that name the file and key."""

    def __init__(self, where: str) -> None:
        self.where = where

    def text(self, table: dict[str, Any], dotted: str, default: Any) -> Any:
        value = table.get(dotted.rsplit(".", 1)[-1], default)
        if not isinstance(value, str):
            raise ConfigError(f"{self.where}: {dotted} must be a string, got {value!r}")
        return value

    def opt_str(self, table: dict[str, Any], dotted: str, default: Any) -> Any:
        value = table.get(dotted.rsplit(".", 1)[-1], default)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{self.where}: {dotted} must be a string, got {value!r}")
        return value or default

    def path(self, table: dict[str, Any], dotted: str) -> str | None:
        """A file named by the config: relative to the config file's directory."""
        value = self.opt_str(table, dotted, None)
        return None if value is None else self._near(value)

    def paths(self, table: dict[str, Any], dotted: str) -> tuple[str, ...]:
        """A list of files named by the config, each as ``path`` reads one."""
        value = table.get(dotted.rsplit(".", 1)[-1], [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{self.where}: {dotted} must be a list of file names")
        return tuple(self._near(v) for v in value)

    def _near(self, name: str) -> str:
        return str(Path(self.where).parent / Path(name).expanduser())

    def flag(self, table: dict[str, Any], dotted: str, default: bool) -> bool:
        value = table.get(dotted.rsplit(".", 1)[-1], default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.where}: {dotted} must be true or false")
        return value

    def number(
        self, table: dict[str, Any], dotted: str, default: Any, key: str | None = None
    ) -> Any:
        value = table.get(key if key is not None else dotted.rsplit(".", 1)[-1], default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{self.where}: {dotted} must be a number, got {value!r}")
        number = finite(value)
        if number is None:
            raise ConfigError(f"{self.where}: {dotted} must be finite, got {shown(value)}")
        return number


def finite(value: int | float) -> float | None:
    """``value`` as a finite float, or None: TOML integers have no size limit, and one past
    a float's range overflows (found by bench/fuzz.py) rather than being infinite."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def shown(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error message stays one short line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} characters)"


def broker_from_table(table: dict[str, Any], where: str) -> BrokerSettings:
    """The ``[broker]`` table: URL plus credential, TLS and reconnect settings."""
    get = Getter(where)
    url = get.text(table, "broker.url", "mqtt://localhost")
    try:
        broker = parse_broker_url(url)
    except ValueError as exc:
        raise ConfigError(f"{where}: broker.url: {exc}") from None
    broker = replace(
        broker,
        username=get.opt_str(table, "broker.username", broker.username),
        password_file=get.opt_str(table, "broker.password_file", None),
        ca_file=get.opt_str(table, "broker.ca_file", None),
        cert_file=get.opt_str(table, "broker.cert_file", None),
        key_file=get.opt_str(table, "broker.key_file", None),
        keepalive_s=get.number(table, "broker.keepalive_s", broker.keepalive_s),
        reconnect_min_s=get.number(table, "broker.reconnect_min_s", broker.reconnect_min_s),
        reconnect_max_s=get.number(table, "broker.reconnect_max_s", broker.reconnect_max_s),
    )
    if not 0 < broker.reconnect_min_s <= broker.reconnect_max_s:
        raise ConfigError(f"{where}: need 0 < broker.reconnect_min_s <= broker.reconnect_max_s")
    if not 1 <= broker.keepalive_s <= 65535:
        raise ConfigError(f"{where}: broker.keepalive_s must be in [1, 65535] s")
    for key in ("password_file", "ca_file", "cert_file", "key_file"):
        _check_readable(where, f"broker.{key}", getattr(broker, key))
    return broker


def check_metrics_listen(where: str, listen: str | None) -> None:
    """ConfigError unless ``[metrics] listen`` (or ``--metrics-listen``) is HOST:PORT."""
    if listen is None:
        return
    try:
        parse_listen(listen)
    except ValueError as exc:
        raise ConfigError(f"{where}: metrics.listen (--metrics-listen): {exc}") from None


def _check_readable(where: str, dotted: str, path: str | None) -> None:
    """A file the process reads when it connects must be there when it starts.

    Found only at connect time, a missing password or TLS file was an error retried
    for ever (issue 12). Only opened here, not read: the password is read at each
    connect, so a rotated one is picked up. Non-blocking: a FIFO does not hang the load.
    """
    if path is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{where}: {dotted}: cannot read {path}: {exc.strerror}") from None
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise ConfigError(f"{where}: {dotted}: {path} is a directory, not a file")
    finally:
        os.close(fd)
