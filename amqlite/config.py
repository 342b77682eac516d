"""Configuration: a TOML file plus command-line overrides -> frozen dataclasses.

:func:`load_config` is the only way in. It reads the file (``tomli``), lays the
overrides over it, and validates everything once; what it returns is
guaranteed consistent, so nothing downstream re-checks or sees a raw dict.
Every problem raises :class:`~amqlite.errors.ConfigError` naming the offending
key as a dotted path (``server.port``, ``users[0].permissions."/".write``).

Validation is table-driven: each TOML table has a :class:`_TableSpec` mapping
its keys to converters (type and range checks). Checks across tables (user
names unique, permission vhosts exist) live in :func:`_check_references`.
Tables other than ``[server]``, ``[storage]``, ``[cluster]``, ``[amqp]``, ``[http]``, ``[tls]``,
``[limits]``, ``[log]``, ``[[users]]`` and ``[[cluster_mta]]`` (exchange peering,
docs/peering.md) are refused as unknown keys. ``[tls]`` files must exist and load (a
certificate that does not match its key names ``tls.key``) when a listener or a link
uses TLS.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli

from amqlite import tls as _tls
from amqlite.auth import TAGS, parse_password_hash
from amqlite.errors import ConfigError
from amqlite.log import LOG_FORMATS, LOG_LEVELS
from amqlite.peering import (
    Address,
    OverflowPolicy,
    PeeringMode,
    parse_addresses,
    parse_mode,
    parse_overflow,
)

__all__ = [
    "AmqpConfig",
    "ClusterConfig",
    "Config",
    "HttpConfig",
    "LimitsConfig",
    "LogConfig",
    "PeeringConfig",
    "ServerConfig",
    "StorageConfig",
    "TlsConfig",
    "UserConfig",
    "VhostPermissions",
    "load_config",
]


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """``[server]``: where to listen and the limits offered to clients."""

    host: str = "127.0.0.1"
    port: int = 5555
    node_id: str = ""
    data_dir: str = ""
    max_frame_bytes: int = 4 * 1024 * 1024
    heartbeat: float = 5.0
    vhosts: tuple[str, ...] = ("/",)
    #: record publishes, deliveries and acks into stream ``amq.trace`` (docs/spark.md)
    trace: bool = False
    #: the native listener speaks TLS only (``[tls]``; ``amqlites://`` clients)
    tls: bool = False

    def effective_node_id(self, bound_port: int | None = None) -> str:
        """``node_id``, or ``"<host>:<port>"`` when it is empty.

        Pass the port actually bound when ``port`` is 0 (any free port), so the
        id names a real address.
        """
        if self.node_id:
            return self.node_id
        port = self.port if bound_port is None else bound_port
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{port}"

    def effective_data_dir(self, bound_port: int | None = None) -> str:
        """``data_dir``, or ``amqlite-data/node-<port>`` (relative to the working
        directory) when it is empty, so two nodes started from one directory (an
        HA pair on one machine) never share a journal."""
        if self.data_dir:
            return self.data_dir
        port = self.port if bound_port is None else bound_port
        return os.path.join(DEFAULT_DATA_ROOT, f"node-{port}")


DEFAULT_DATA_ROOT = "amqlite-data"
FSYNC_POLICIES = ("always", "batch", "never")


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """``[storage]``: the journal (docs/storage.md). ``persist = false`` keeps
    everything in memory: nothing is written and nothing survives a restart."""

    persist: bool = True
    fsync: str = "batch"
    batch_ms: float = 10.0
    segment_bytes: int = 64 * 1024 * 1024


HA_ROLES = ("", "primary", "backup")


@dataclass(frozen=True, slots=True)
class AmqpConfig:
    """``[amqp]``: the AMQP 0-9-1 listener (docs/amqp.md), off unless ``port`` is set.

    ``host`` empty means ``server.host``. ``heartbeat``, ``frame_max`` and
    ``channel_max`` are what the server proposes in ``connection.tune`` (RabbitMQ's
    defaults); a client may ask for less, never for more.
    """

    port: int | None = None
    host: str = ""
    heartbeat: float = 60.0
    frame_max: int = 131_072
    channel_max: int = 2047
    #: the AMQP listener speaks TLS only (amqps; RabbitMQ's port for it is 5671)
    tls: bool = False

    @property
    def enabled(self) -> bool:
        return self.port is not None

    def listen_host(self, server: ServerConfig) -> str:
        return self.host or server.host


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """``[http]``: the management API, ``/metrics`` and health checks (docs/http.md),
    off unless ``port`` is set (RabbitMQ's management port is 15672).

    ``host`` empty means ``server.host``; ``tls`` serves HTTPS only, with ``[tls]``'s
    certificate. ``allowed_origins`` lists the origins (``https://app.example``)
    whose pages may open the browser channels besides the listener's own
    (docs/browser.md); a long-polling session ends after ``poll_idle`` seconds
    without a poll. Over a WebSocket the broker and the page each send a heartbeat
    every ``ws_heartbeat`` seconds when they have nothing else to send, and end the
    session after three heartbeats' time of silence from the other end (0: off).
    """

    port: int | None = None
    host: str = ""
    tls: bool = False
    allowed_origins: tuple[str, ...] = ()
    poll_idle: float = 30.0
    ws_heartbeat: float = 10.0

    @property
    def enabled(self) -> bool:
        return self.port is not None

    def listen_host(self, server: ServerConfig) -> str:
        return self.host or server.host


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``[cluster]``: an HA pair (docs/ha.md). ``role`` (set by ``--is_primary`` /
    ``--is_backup``) picks this node's side; empty means a standalone broker. One
    file can serve both nodes: each dials the other side's address."""

    role: str = ""
    vhost: str = "/"
    primary_peer: str = "127.0.0.1:5555"
    backup_peer: str = "127.0.0.1:6666"
    heartbeat_ms: int = 200
    failover_timeout_ms: int = 1000
    login: str = "guest"
    password: str = field(default="guest", repr=False)
    #: ``host:port`` of an ``amqlite witness`` (empty: none); the node logs in there
    #: with ``login`` / ``password`` too
    witness: str = ""
    #: without a witness, what a master whose peer is silent promises (docs/ha.md)
    on_peer_silence: str = "serve"
    #: how long a persistent publish waits for a confirm that the promise holds back
    #: (peer and witness out of reach) before it fails
    hold_timeout_ms: int = 10_000

    @property
    def enabled(self) -> bool:
        return bool(self.role)

    @property
    def peer(self) -> str:
        """The address this node dials: the other side's."""
        return self.backup_peer if self.role == "primary" else self.primary_peer

    @property
    def addresses(self) -> list[str]:
        """The pair's client addresses, primary first (given to clients)."""
        return [self.primary_peer, self.backup_peer]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """``[tls]``: the node's certificate and how remotes are verified (docs/tls.md).

    Used by the listeners with ``tls = true`` (``[server]``, ``[amqp]``) and by the
    node's own dials: the HA peer link when ``server.tls`` is on (the peer's native
    listener speaks TLS), a peering link with ``tls = true``. ``key`` empty: the key
    is in the ``cert`` file. ``ca`` empty: the system's trust store. ``verify`` is
    ``none``, ``peer`` (dials verify the remote; the default) or ``mutual`` (TLS
    listeners also require client certificates signed by ``ca``).
    """

    cert: str = ""
    key: str = ""
    ca: str = ""
    verify: str = "peer"
    min_version: str = "1.2"


MIB = 1024 * 1024
#: RabbitMQ's hard cap on ``max_message_size`` (512 MiB), ours too.
MAX_MESSAGE_SIZE_CAP = 512 * MIB


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """``[limits]``: the memory and disk alarms (RabbitMQ's defaults; README,
    docs/protocol.md "Alarms") and the limits on what clients may hold (README
    "Limits", docs/protocol.md "Limits").

    ``memory_high_watermark`` below 1 is a fraction of the machine's memory (or of
    the cgroup's limit, when smaller); 1 or more is a number of bytes. Over it the
    broker blocks every publishing connection. ``disk_free_limit`` is in bytes:
    with less free space on the data directory's file system, connections that
    publish persistent messages are blocked. 0 switches the disk alarm off.

    The counts below refuse what would go past them with an error naming the
    setting; for the ``max_..._per_...`` ones 0 means no limit (RabbitMQ's default
    for them). ``max_unauthenticated_connections`` bounds the sockets that have not
    finished their handshake: past it the oldest is closed. A socket that has not
    finished its handshake within ``handshake_timeout`` seconds is closed.
    """

    memory_high_watermark: float = 0.4
    disk_free_limit: int = 50_000_000
    max_connections: int = 10_000
    max_connections_per_user: int = 0
    max_unauthenticated_connections: int = 1024
    handshake_timeout: float = 10.0
    max_consumers_per_connection: int = 0
    max_queues_per_vhost: int = 0
    max_message_size: int = 16 * MIB

    def memory_limit(self, total_memory: int) -> int:
        """The watermark in bytes, given the memory available to the process."""
        mark = self.memory_high_watermark
        return int(mark * total_memory) if mark < 1 else int(mark)


@dataclass(frozen=True, slots=True)
class LogConfig:
    """``[log]``: how and how much the server logs."""

    format: str = "console"
    level: str = "info"


@dataclass(frozen=True, slots=True)
class VhostPermissions:
    """``[users.permissions."<vhost>"]``: valid regexes; a missing one is ``""`` (nothing)."""

    vhost: str
    configure: str = ""
    write: str = ""
    read: str = ""


@dataclass(frozen=True, slots=True)
class UserConfig:
    """``[[users]]``: a login, its scrypt hash, its tags and its rights per vhost.

    A user without a permissions table for a vhost cannot open that vhost. Tags
    (:data:`amqlite.auth.TAGS`) grant the node's privileged actions.
    """

    name: str
    password_hash: str = field(repr=False)
    permissions: tuple[VhostPermissions, ...] = ()
    tags: tuple[str, ...] = ()

    def permissions_for(self, vhost: str) -> VhostPermissions | None:
        """This user's grant in ``vhost``, or None."""
        return next((grant for grant in self.permissions if grant.vhost == vhost), None)


PEERING_EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")


@dataclass(frozen=True, slots=True)
class PeeringConfig:
    """``[[cluster_mta]]``: one peering link from the local exchange ``name`` to the
    exchange of the same name on a remote broker or HA pair (docs/peering.md).

    ``host`` is the remote's address list, tried in order. ``type`` is used only
    when the exchange does not exist at start-up (the node declares it durable).
    """

    name: str
    host: tuple[Address, ...]
    mode: PeeringMode
    vhost: str = "/"
    login: str = "peering"
    password: str = field(default="", repr=False)
    max_hops: int = 8
    buffer_bytes: int = 16 * 1024 * 1024
    overflow: OverflowPolicy = OverflowPolicy.BLOCK
    heartbeat: float = 1.0
    type: str = "topic"
    lease: float = 24 * 3600.0
    #: dial the remote over TLS, verifying it against ``[tls] ca`` and its host name
    tls: bool = False

    @property
    def hosts(self) -> str:
        """The address list as written (``primary:port,backup:port``)."""
        return ",".join(str(address) for address in self.host)


@dataclass(frozen=True, slots=True)
class Config:
    """A whole, validated configuration. ``dataclasses.replace`` derives variants."""

    server: ServerConfig = field(default_factory=ServerConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    amqp: AmqpConfig = field(default_factory=AmqpConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    users: tuple[UserConfig, ...] = ()
    cluster_mta: tuple[PeeringConfig, ...] = ()

    @property
    def uses_tls(self) -> bool:
        """True when a listener or one of the node's dials speaks TLS."""
        return (
            self.server.tls
            or self.amqp.tls
            or self.http.tls
            or any(link.tls for link in self.cluster_mta)
        )

    @classmethod
    def default(cls) -> Config:
        """What an empty file gives: one broker on 127.0.0.1:5555, loopback guest."""
        return cls()


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Read ``path`` (if any), apply ``overrides``, validate, and return the Config.

    ``overrides`` use dotted keys (``{"server.port": 0, "log.format": "json"}``)
    and win over the file; a value of None means "not given" and is skipped, so
    the CLI can pass every flag as-is. Override values are checked exactly like
    file values (``"5555"`` is not an integer).
    """
    raw: dict[str, Any] = {} if path is None else _read_toml(path)
    _apply_overrides(raw, overrides or {})
    config: Config = _build_table(_CONFIG_SPEC, "", raw)
    _check_references(config)
    return config


def _read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    where = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(where, f"cannot read file: {exc.strerror or exc}") from exc
    try:
        return tomli.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(where, f"not UTF-8 text: {exc}") from exc
    except tomli.TOMLDecodeError as exc:
        raise ConfigError(where, f"invalid TOML: {exc}") from exc


def _apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    for dotted, value in overrides.items():
        if value is None:
            continue
        parts = dotted.split(".")
        if not all(parts):
            raise ConfigError(dotted, "override keys are dotted names like 'server.port'")
        table = raw
        for depth, part in enumerate(parts[:-1], start=1):
            child = table.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(".".join(parts[:depth]), "is not a table; cannot override in it")
            table = child
        table[parts[-1]] = value


# --- table-driven validation ------------------------------------------------------

_Convert = Callable[[str, Any], Any]
"""Turns the raw value at a key into its validated form, or raises ConfigError."""


@dataclass(frozen=True, slots=True)
class _TableSpec:
    """One TOML table: the dataclass it builds and a converter per known key."""

    build: Callable[..., Any]
    fields: Mapping[str, _Convert]
    required: frozenset[str] = frozenset()


def _build_table(spec: _TableSpec, key: str, raw: Any, **extra: Any) -> Any:
    table = _expect_table(key, raw)
    values: dict[str, Any] = {}
    for name, value in table.items():
        convert = spec.fields.get(name)
        if convert is None:
            raise ConfigError(_join(key, name), _unknown_key_reason(name, spec.fields))
        values[name] = convert(_join(key, name), value)
    missing = sorted(spec.required - values.keys())
    if missing:
        raise ConfigError(_join(key, missing[0]), "is required")
    return spec.build(**extra, **values)


def _unknown_key_reason(name: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _join(prefix: str, name: str) -> str:
    """A dotted key path, quoting names that TOML would quote."""
    part = name if _BARE_KEY.fullmatch(name) else '"' + name.replace('"', '\\"') + '"'
    return f"{prefix}.{part}" if prefix else part


def _type_name(value: Any) -> str:
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _expect_table(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(key, f"must be a table, got {_type_name(value)}")
    return value


def _integer(minimum: int, maximum: int | None = None) -> _Convert:
    def convert(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"must be an integer, got {_type_name(value)}")
        _check_range(key, value, minimum, maximum)
        return value

    return convert


def _number(minimum: float) -> _Convert:
    def convert(key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(key, f"must be a number, got {_type_name(value)}")
        if not math.isfinite(value):
            raise ConfigError(key, f"must be a finite number, got {value}")
        _check_range(key, value, minimum, None)
        return float(value)

    return convert


def _check_range(key: str, value: float, minimum: float, maximum: float | None) -> None:
    if maximum is not None and not minimum <= value <= maximum:
        raise ConfigError(key, f"must be between {minimum} and {maximum}, got {value}")
    if value < minimum:
        raise ConfigError(key, f"must be at least {minimum}, got {value}")


def _string(*, allow_empty: bool = False) -> _Convert:
    def convert(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ConfigError(key, f"must be a string, got {_type_name(value)}")
        if not value and not allow_empty:
            raise ConfigError(key, "must not be empty")
        return value

    return convert


def _choice(options: tuple[str, ...]) -> _Convert:
    as_string = _string()

    def convert(key: str, value: Any) -> str:
        text: str = as_string(key, value)
        if text not in options:
            listed = ", ".join(repr(option) for option in options)
            raise ConfigError(key, f"must be one of {listed}, got {text!r}")
        return text

    return convert


def _unique_names(what: str) -> _Convert:
    as_name = _string()

    def convert(key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list | tuple):
            raise ConfigError(key, f"must be an array of strings, got {_type_name(value)}")
        if not value:
            raise ConfigError(key, "must not be empty")
        names: list[str] = []
        for index, item in enumerate(value):
            name = as_name(f"{key}[{index}]", item)
            if name in names:
                raise ConfigError(f"{key}[{index}]", f"duplicate {what} {name!r}")
            names.append(name)
        return tuple(names)

    return convert


_ORIGIN = re.compile(r"https?://[^/?#\s]+")


def _origins(key: str, value: Any) -> tuple[str, ...]:
    """Web origins: ``scheme://host[:port]``, no path (a trailing slash is dropped)."""
    if not isinstance(value, list | tuple):
        raise ConfigError(key, f"must be an array of origins, got {_type_name(value)}")
    origins: list[str] = []
    for index, item in enumerate(value):
        origin: str = _string()(f"{key}[{index}]", item)
        origin = origin.rstrip("/")
        if not _ORIGIN.fullmatch(origin):
            raise ConfigError(
                f"{key}[{index}]",
                f"{item!r} is not an origin (scheme://host[:port], e.g. https://app.example)",
            )
        origins.append(origin.lower())
    return tuple(origins)


def _file(key: str, value: Any) -> str:
    """A path to a readable file (empty: not given)."""
    path: str = _string(allow_empty=True)(key, value)
    if path and not os.path.isfile(path):
        raise ConfigError(key, f"no such file: {path!r}")
    if path and not os.access(path, os.R_OK):
        raise ConfigError(key, f"cannot read file: {path!r}")
    return path


def _moved(where: str) -> _Convert:
    """A key that now lives elsewhere: refused with where it went."""

    def convert(key: str, value: Any) -> Any:
        raise ConfigError(key, f"has moved: set {where} instead")

    return convert


def _boolean(key: str, value: Any) -> bool:
    if type(value) is not bool:
        raise ConfigError(key, f"must be true or false, got {_type_name(value)}")
    return value


def _regex(key: str, value: Any) -> str:
    pattern: str = _string(allow_empty=True)(key, value)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(key, f"invalid regex {pattern!r}: {exc}") from exc
    return pattern


def _password_hash(key: str, value: Any) -> str:
    encoded: str = _string()(key, value)
    if parse_password_hash(encoded) is None:
        raise ConfigError(key, "not a valid scrypt$ hash (make one with `amqlite passwd`)")
    return encoded


def _tags(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise ConfigError(key, f"must be an array of tags, got {_type_name(value)}")
    tags: list[str] = []
    for index, item in enumerate(value):
        tag: str = _string()(f"{key}[{index}]", item)
        if tag not in TAGS:
            listed = ", ".join(repr(known) for known in TAGS)
            raise ConfigError(f"{key}[{index}]", f"unknown tag {tag!r} (known: {listed})")
        if tag in tags:
            raise ConfigError(f"{key}[{index}]", f"duplicate tag {tag!r}")
        tags.append(tag)
    return tuple(tags)


def _table(spec: _TableSpec) -> _Convert:
    def convert(key: str, value: Any) -> Any:
        return _build_table(spec, key, value)

    return convert


def _array_of_tables(spec: _TableSpec) -> _Convert:
    def convert(key: str, value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise ConfigError(key, f"must be an array of tables, got {_type_name(value)}")
        return tuple(_build_table(spec, f"{key}[{i}]", item) for i, item in enumerate(value))

    return convert


def _table_of_tables(spec: _TableSpec, name_field: str) -> _Convert:
    """A table whose keys are names (vhosts) and whose values are ``spec`` tables."""

    def convert(key: str, value: Any) -> tuple[Any, ...]:
        table = _expect_table(key, value)
        return tuple(
            _build_table(spec, _join(key, name), item, **{name_field: name})
            for name, item in table.items()
        )

    return convert


_SERVER_SPEC = _TableSpec(
    ServerConfig,
    {
        "host": _string(),
        "port": _integer(0, 65535),
        "node_id": _string(allow_empty=True),
        "data_dir": _string(allow_empty=True),
        "max_frame_bytes": _integer(4096),
        "heartbeat": _number(0),
        "max_connections": _moved("limits.max_connections"),
        "vhosts": _unique_names("vhost"),
        "trace": _boolean,
        "tls": _boolean,
    },
)

_STORAGE_SPEC = _TableSpec(
    StorageConfig,
    {
        "persist": _boolean,
        "fsync": _choice(FSYNC_POLICIES),
        "batch_ms": _number(0.1),
        "segment_bytes": _integer(64 * 1024),
    },
)


def _address(key: str, value: Any) -> str:
    text: str = _string()(key, value)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(key, f"must be host:port, got {text!r}")
    return text


ON_PEER_SILENCE = ("serve", "hold")


def _witness_address(key: str, value: Any) -> str:
    return "" if value == "" else _address(key, value)


_CLUSTER_SPEC = _TableSpec(
    ClusterConfig,
    {
        "role": _choice(HA_ROLES),
        "vhost": _string(),
        "primary_peer": _address,
        "backup_peer": _address,
        "heartbeat_ms": _integer(10, 60_000),
        "failover_timeout_ms": _integer(20, 600_000),
        "login": _string(),
        "password": _string(allow_empty=True),
        "witness": _witness_address,
        "on_peer_silence": _choice(ON_PEER_SILENCE),
        "hold_timeout_ms": _integer(100, 3_600_000),
    },
)

_AMQP_SPEC = _TableSpec(
    AmqpConfig,
    {
        "port": _integer(0, 65535),
        "host": _string(allow_empty=True),
        "heartbeat": _number(0),
        # AMQP 0-9-1's smallest frame_max is 4096; its field is a 32-bit integer
        "frame_max": _integer(4096, 2**31 - 1),
        "channel_max": _integer(1, 65535),
        "tls": _boolean,
    },
)

_HTTP_SPEC = _TableSpec(
    HttpConfig,
    {
        "port": _integer(0, 65535),
        "host": _string(allow_empty=True),
        "tls": _boolean,
        "allowed_origins": _origins,
        "poll_idle": _number(0.1),
        "ws_heartbeat": _number(0),
    },
)

_TLS_SPEC = _TableSpec(
    TlsConfig,
    {
        "cert": _file,
        "key": _file,
        "ca": _file,
        "verify": _choice(_tls.VERIFY_MODES),
        "min_version": _choice(tuple(_tls.MIN_VERSIONS)),
    },
)


def _watermark(key: str, value: Any) -> float:
    """A fraction of memory (0 < f < 1) or a whole number of bytes (>= 1)."""
    mark: float = _number(0)(key, value)
    if mark <= 0:
        raise ConfigError(key, f"must be a fraction (0 < f < 1) or bytes (>= 1), got {value}")
    if mark >= 1 and not mark.is_integer():
        raise ConfigError(
            key, f"must be a fraction below 1 or a whole number of bytes, got {value}"
        )
    return mark


_LIMITS_SPEC = _TableSpec(
    LimitsConfig,
    {
        "memory_high_watermark": _watermark,
        "disk_free_limit": _integer(0),
        "max_connections": _integer(1),
        "max_connections_per_user": _integer(0),
        "max_unauthenticated_connections": _integer(1),
        "handshake_timeout": _number(0.1),
        "max_consumers_per_connection": _integer(0),
        "max_queues_per_vhost": _integer(0),
        "max_message_size": _integer(1, MAX_MESSAGE_SIZE_CAP),
    },
)

_LOG_SPEC = _TableSpec(LogConfig, {"format": _choice(LOG_FORMATS), "level": _choice(LOG_LEVELS)})

_PERMISSIONS_SPEC = _TableSpec(
    VhostPermissions, {"configure": _regex, "write": _regex, "read": _regex}
)

_USER_SPEC = _TableSpec(
    UserConfig,
    {
        "name": _string(),
        "password_hash": _password_hash,
        "permissions": _table_of_tables(_PERMISSIONS_SPEC, "vhost"),
        "tags": _tags,
    },
    required=frozenset({"name", "password_hash"}),
)


def _peering_hosts(key: str, value: Any) -> tuple[Address, ...]:
    text: str = _string()(key, value)
    return parse_addresses(text, key)


def _peering_mode(key: str, value: Any) -> PeeringMode:
    return parse_mode(value, key)


def _peering_overflow(key: str, value: Any) -> OverflowPolicy:
    return parse_overflow(value, key)


_PEERING_SPEC = _TableSpec(
    PeeringConfig,
    {
        "name": _string(),
        "vhost": _string(),
        "host": _peering_hosts,
        "login": _string(),
        "password": _string(allow_empty=True),
        "mode": _peering_mode,
        "max_hops": _integer(1, 255),
        "buffer_bytes": _integer(1024),
        "overflow": _peering_overflow,
        "heartbeat": _number(0),
        "type": _choice(PEERING_EXCHANGE_TYPES),
        "lease": _number(0.1),
        "tls": _boolean,
    },
    required=frozenset({"name", "host", "mode"}),
)

_CONFIG_SPEC = _TableSpec(
    Config,
    {
        "server": _table(_SERVER_SPEC),
        "storage": _table(_STORAGE_SPEC),
        "cluster": _table(_CLUSTER_SPEC),
        "amqp": _table(_AMQP_SPEC),
        "http": _table(_HTTP_SPEC),
        "tls": _table(_TLS_SPEC),
        "limits": _table(_LIMITS_SPEC),
        "log": _table(_LOG_SPEC),
        "users": _array_of_tables(_USER_SPEC),
        "cluster_mta": _array_of_tables(_PEERING_SPEC),
    },
)


def _check_references(config: Config) -> None:
    """Rules that span tables: unique user names, permissions only on known vhosts,
    a sane HA pair."""
    cluster = config.cluster
    if cluster.failover_timeout_ms <= cluster.heartbeat_ms:
        raise ConfigError(
            "cluster.failover_timeout_ms",
            f"must be longer than cluster.heartbeat_ms ({cluster.heartbeat_ms}), "
            f"got {cluster.failover_timeout_ms}",
        )
    if cluster.enabled and cluster.vhost not in config.server.vhosts:
        raise ConfigError(
            "cluster.vhost",
            f"unknown vhost {cluster.vhost!r} (server.vhosts is {list(config.server.vhosts)})",
        )
    if cluster.enabled and not config.storage.persist:
        raise ConfigError(
            "storage.persist", "an HA pair replicates its journal: it needs persist = true"
        )
    if cluster.enabled and cluster.primary_peer == cluster.backup_peer:
        raise ConfigError("cluster.backup_peer", "must differ from cluster.primary_peer")
    if cluster.enabled and cluster.witness in (cluster.primary_peer, cluster.backup_peer):
        raise ConfigError("cluster.witness", "must differ from both nodes' addresses")
    links: set[tuple[str, str, str]] = set()
    for index, link in enumerate(config.cluster_mta):
        link_key = f"cluster_mta[{index}]"
        if link.vhost not in config.server.vhosts:
            raise ConfigError(
                f"{link_key}.vhost",
                f"unknown vhost {link.vhost!r} (server.vhosts is {list(config.server.vhosts)})",
            )
        ident = (link.vhost, link.name, link.hosts)
        if ident in links:
            raise ConfigError(
                f"{link_key}.host",
                f"duplicate link: exchange {link.name!r} in vhost {link.vhost!r} "
                f"is already peered with {link.hosts}",
            )
        links.add(ident)
    _check_cluster_login(config)
    _check_tls(config)
    seen: set[str] = set()
    for index, user in enumerate(config.users):
        user_key = f"users[{index}]"
        if user.name in seen:
            raise ConfigError(f"{user_key}.name", f"duplicate user {user.name!r}")
        seen.add(user.name)
        for grant in user.permissions:
            if grant.vhost not in config.server.vhosts:
                raise ConfigError(
                    _join(f"{user_key}.permissions", grant.vhost),
                    f"unknown vhost {grant.vhost!r} "
                    f"(server.vhosts is {list(config.server.vhosts)})",
                )


def _check_cluster_login(config: Config) -> None:
    """One file often serves both nodes of a pair: when it defines the user the
    peer link logs in as, that user must carry the ``cluster`` tag (the other node
    refuses the link otherwise)."""
    cluster = config.cluster
    if not cluster.enabled:
        return
    for index, user in enumerate(config.users):
        if user.name == cluster.login and "cluster" not in user.tags:
            raise ConfigError(
                "cluster.login",
                f"user {user.name!r} opens the HA peer link but lacks the 'cluster' tag "
                f"(add it to users[{index}].tags)",
            )


def _check_tls(config: Config) -> None:
    """A TLS listener needs a certificate that loads with its key; ``mutual`` needs
    the CA that client certificates are checked against; a dial needs a CA that loads."""
    tls = config.tls
    if not config.uses_tls:
        return
    listening = config.server.tls or config.amqp.tls or config.http.tls
    user = next(
        (
            key
            for key, on in (
                ("server.tls", config.server.tls),
                ("amqp.tls", config.amqp.tls),
                ("http.tls", config.http.tls),
            )
            if on
        ),
        "",
    )
    if listening and not tls.cert:
        raise ConfigError("tls.cert", f"is required: {user} = true serves TLS")
    if tls.verify == "mutual" and not tls.ca:
        raise ConfigError("tls.ca", "is required with verify = 'mutual' (client certificates)")
    if tls.key and not tls.cert:
        raise ConfigError("tls.cert", "is required when tls.key is given")
    if tls.cert:
        try:
            _tls.server_context(tls)
        except (ssl.SSLError, OSError) as exc:
            key = "tls.key" if tls.key else "tls.cert"
            raise ConfigError(key, f"cannot load the certificate and its key: {exc}") from exc
    if tls.ca:
        try:
            _tls.client_context(ca=tls.ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError("tls.ca", f"cannot load the CA certificates: {exc}") from exc
