"""The configured recorder URL (or path, or nothing) to a recorder; the token, kept out of it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from powerd.recorder.base import Recorder
from powerd.recorder.file import DEFAULT_FILE_NAME, FileRecorder
from powerd.recorder.influx import Influx1Recorder, InfluxRecorder

TOKEN_ENV = "INFLUX_TOKEN"

_INFLUX_SCHEMES = {
    "influx+http": "http",
    "influx+https": "https",
    "http": "http",
    "https": "https",
    "influx1+http": "http",
    "influx1+https": "https",
}
_INFLUX_OPTIONS: dict[str, Callable[[str], Any]] = {
    "batch_size": int,
    "flush_interval_s": float,
    "max_buffer_points": int,
    "timeout_s": float,
    "retry_min_s": float,
    "retry_max_s": float,
    "gzip": lambda v: v.lower() in ("1", "true", "yes", "on"),
}


def default_file_path() -> Path:
    """Where points go with nothing configured: ``$STATE_DIRECTORY`` (systemd's
    ``StateDirectory=powerd``, i.e. /var/lib/powerd), else ``$XDG_STATE_HOME/powerd``,
    else ``~/.local/state/powerd``; the file is ``telemetry.lp``."""
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        # systemd may list several, colon-separated: the first is ours
        return Path(state.split(":")[0]) / DEFAULT_FILE_NAME
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "powerd" / DEFAULT_FILE_NAME


def open_recorder(
    url: str | os.PathLike[str] | None,
    *,
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Recorder:
    """The recorder a configured ``url`` names.

    - ``influx+http://HOST:PORT[/PREFIX]?org=ORG&bucket=BUCKET`` (or
      ``influx+https://``, or plain ``http://`` / ``https://``): InfluxDB's v2
      write API at that address (``/api/v2/write`` is appended). ``org`` and
      ``bucket`` are required; optional: ``batch_size``, ``flush_interval_s``,
      ``max_buffer_points``, ``timeout_s``, ``retry_min_s``, ``retry_max_s``, ``gzip``.
      The token is never part of the URL (it would end up in logs): ``token``,
      else the first line of ``token_file``, else ``$INFLUX_TOKEN``, else none
      (VictoriaMetrics needs none; InfluxDB 1.8 takes ``user:password``).
    - ``influx1+http://HOST:PORT?db=DB[&rp=POLICY]`` (or ``influx1+https://``): InfluxDB
      1.x's ``/write`` (1.6 and 1.7 have no v2 API); the token, if any, is ``user:password``.
      Same options as above.
    - ``file:///path/x.lp`` or a plain path: ``FileRecorder`` (the directory must exist).
    - ``None`` or empty: ``FileRecorder`` at ``default_file_path()``, its directory created.

    ``options`` go to the recorder's constructor and override the URL's. Raises
    ``ValueError`` (or ``OSError`` for the file) on a configuration error.
    """
    if url is None or str(url).strip() == "":
        path = default_file_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileRecorder(path, **options)
    text = str(url).strip()
    if "://" not in text:
        return FileRecorder(Path(text).expanduser(), **options)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"recorder url {text!r}: a file URL has no host (file:///path)")
        return FileRecorder(Path(parts.path), **options)
    if scheme not in _INFLUX_SCHEMES:
        raise ValueError(
            f"recorder url {text!r}: scheme must be influx+http(s), http(s), influx1+http(s)"
            " or file"
        )
    if not parts.hostname:
        raise ValueError(f"recorder url {text!r} has no host")
    if parts.username or parts.password:
        raise ValueError(
            f"recorder url {_redact(parts)!r}: credentials go in the token, not the URL"
        )
    query: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in query:
            raise ValueError(f"recorder url {text!r}: {key} given twice")
        query[key] = value
    if "token" in query:
        raise ValueError(
            "recorder url: do not put the token in the URL; use token_file or $" + TOKEN_ENV
        )
    v1 = scheme.startswith("influx1+")
    if v1:
        database, policy = query.pop("db", ""), query.pop("rp", "")
        if not database or "org" in query or "bucket" in query:
            raise ValueError(
                f"recorder url {text!r}: InfluxDB 1.x takes db (and rp), not org and bucket:"
                " influx1+http://host:8086?db=powerd"
            )
    else:
        org, bucket = query.pop("org", ""), query.pop("bucket", "")
        if not org or not bucket:
            raise ValueError(
                f"recorder url {text!r} needs org and bucket:"
                " influx+http://host:8086?org=ORG&bucket=BUCKET"
            )
    kwargs: dict[str, Any] = {}
    for key, value in query.items():
        convert = _INFLUX_OPTIONS.get(key)
        if convert is None:
            known = ", ".join([*(("db", "rp") if v1 else ("org", "bucket")), *_INFLUX_OPTIONS])
            raise ValueError(f"recorder url: unknown option {key!r} (known: {known})")
        try:
            kwargs[key] = convert(value)
        except ValueError:
            raise ValueError(f"recorder url: {key}={value!r} is not valid") from None
    kwargs.update(options)
    if token is None:
        token = read_token(token_file, "recorder token file")
    base = urlunsplit((_INFLUX_SCHEMES[scheme], parts.netloc, parts.path.rstrip("/"), "", ""))
    try:
        if v1:
            return Influx1Recorder(base, token, database, policy or None, **kwargs)
        return InfluxRecorder(base, token, org, bucket, **kwargs)
    except TypeError as exc:
        raise ValueError(f"recorder: {exc}") from None


def read_token(token_file: str | os.PathLike[str] | None, what: str = "token file") -> str | None:
    """An InfluxDB token: the first line of ``token_file``, else ``$INFLUX_TOKEN``, else None.

    Kept out of URLs and command lines, which end up in logs and ``ps``. An empty
    file or first line means no token. ``ValueError`` naming the file if it
    cannot be read.
    """
    if token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    try:
        lines = Path(token_file).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"{what} {token_file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} {token_file}: not UTF-8 text") from None
    return (lines[0].strip() if lines else "") or None


def _redact(parts: Any) -> str:
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    redacted: str = urlunsplit((parts.scheme, host, parts.path, "", ""))
    return redacted
