"""``amqlite server``: flags, config, logging, signals -> a running node."""

from __future__ import annotations

import argparse
import gc
import resource
import signal
import sys
from typing import Any

import structlog
import trio

from amqlite.config import Config, load_config
from amqlite.errors import ConfigError
from amqlite.log import configure_logging
from amqlite.store.errors import StoreError

from .node import BrokerNode, CannotListen

log = structlog.get_logger("amqlite.server")

# The cyclic GC's thresholds (CPython's default is 700, 10, 10). The young
# generation is collected when the container objects made exceed those freed by
# that many (CPython 3.11 counts the difference, not the allocations): little
# of a broker's per-message work is cyclic garbage, so what sets off a young
# collection is a swing in what it holds alive, such as a peering link's log
# filling to its window or byte cap and a queue's backlog; each collection then
# scans and promotes all of it. At 20,000 a sending peering broker still
# collected every 15-60k peered messages (0.4 us of its ~11 us per message;
# round 12, benchmarks/README.md); at 100,000 its swings stay below the
# threshold. The cost is memory: cyclic garbage (rare here) waits for up to
# 100,000 more objects, a few MB (docs/protocol.md, "Limits").
GC_THRESHOLDS = (100_000, 10, 10)
#: File descriptors kept for what is not a connection (listeners, journal segments,
#: the HA and peering links, logs).
FILES_RESERVED = 64

EPILOG = """\
examples:
  amqlite server                          # 127.0.0.1:5555, vhost "/", guest/guest from loopback
  amqlite server --config configs/amq_server.toml --port 5556
  amqlite server --host 0.0.0.0 --log-format json
  amqlite server --data-dir /var/lib/amqlite --fsync always
  amqlite server --in-memory              # keep nothing on disk
  amqlite server --amqp-port 5672         # AMQP 0-9-1 too: pika, kombu, Celery
  amqlite server --http-port 15672        # management API, /metrics, /health (docs/http.md)
  amqlite server --tls --tls-cert node.pem --tls-key node.key   # amqlites:// only
  amqlite server --amqp-port 5671 --amqp-tls --tls-cert node.pem  # amqps (docs/tls.md)
  amqlite server --port 5555 --is_primary 1   # an HA pair on one machine:
  amqlite server --port 6666 --is_backup 1    # see configs/ha-pair.toml, docs/ha.md

Durable exchanges, queues, bindings and persistent messages on durable queues are
kept in a journal in the data dir (default ./amqlite-data/node-<port>) and survive
a restart or a crash; see docs/storage.md.

Flags override the TOML file given by --config. SIGINT/SIGTERM stop the server
gracefully: it stops accepting, closes clients with code 320 and exits 0.
"""


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Run an amqlite broker."
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--config", "-c", metavar="FILE", help="TOML config file")
    parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", "-p", type=int, help="listen port (default 5555; 0 = any)")
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="where the node keeps its journal (default ./amqlite-data/node-<port>)",
    )
    parser.add_argument(
        "--fsync",
        choices=("always", "batch", "never"),
        help="when the journal is flushed to disk: on every commit, every --batch-ms "
        "(default), or never (the OS decides; a power cut may lose confirmed messages)",
    )
    parser.add_argument(
        "--batch-ms", type=float, metavar="MS", help="group-commit interval for --fsync batch"
    )
    parser.add_argument(
        "--in-memory",
        action="store_true",
        default=None,
        help="keep nothing on disk: durable things do not survive a restart",
    )
    parser.add_argument("--node-id", help="node name shown in status (default host:port)")
    parser.add_argument(
        "--amqp-port",
        type=int,
        metavar="N",
        help="also serve AMQP 0-9-1 (pika, kombu, Celery) on port N (0 = any; "
        "default: no AMQP listener; [amqp] in the config; docs/amqp.md)",
    )
    parser.add_argument(
        "--amqp-host", metavar="H", help="AMQP listen address (default: the --host address)"
    )
    parser.add_argument(
        "--http-port",
        type=int,
        metavar="N",
        help="also serve the management API, /metrics and /health on port N (0 = any; "
        "default: no HTTP listener; [http] in the config; docs/http.md)",
    )
    parser.add_argument(
        "--http-host", metavar="H", help="HTTP listen address (default: the --host address)"
    )
    parser.add_argument(
        "--http-allow-origin",
        action="append",
        metavar="ORIGIN",
        help="a web origin (http://127.0.0.1:8000) whose pages may use the browser "
        "channels, besides the listener's own (repeatable; [http] allowed_origins; "
        "docs/browser.md)",
    )
    tls = parser.add_argument_group("TLS ([tls] in the config; docs/tls.md)")
    tls.add_argument(
        "--tls",
        action="store_true",
        default=None,
        help="the native listener speaks TLS only (clients dial amqlites://; the HA "
        "peer link then uses TLS too)",
    )
    tls.add_argument(
        "--amqp-tls",
        action="store_true",
        default=None,
        help="the AMQP listener speaks TLS only (amqps; RabbitMQ's port for it is 5671)",
    )
    tls.add_argument(
        "--http-tls",
        action="store_true",
        default=None,
        help="the HTTP listener speaks HTTPS only (with --tls-cert)",
    )
    tls.add_argument("--tls-cert", metavar="FILE", help="this node's certificate chain (PEM)")
    tls.add_argument("--tls-key", metavar="FILE", help="its private key (default: in --tls-cert)")
    tls.add_argument(
        "--tls-ca", metavar="FILE", help="CA certificates remotes are verified against"
    )
    tls.add_argument(
        "--tls-verify",
        choices=("none", "peer", "mutual"),
        help="none, peer (the node verifies what it dials; default) or mutual (clients "
        "must present a certificate signed by --tls-ca)",
    )
    tls.add_argument(
        "--tls-min-version", choices=("1.2", "1.3"), help="oldest TLS version (default 1.2)"
    )
    ha = parser.add_mutually_exclusive_group()
    ha.add_argument(
        "--is_primary",
        "--is-primary",
        nargs="?",
        const="1",
        choices=("0", "1"),
        metavar="1",
        help="run as the primary of an HA pair ([cluster] in the config; see docs/ha.md)",
    )
    ha.add_argument(
        "--is_backup",
        "--is-backup",
        nargs="?",
        const="1",
        choices=("0", "1"),
        metavar="1",
        help="run as the backup of an HA pair",
    )
    parser.add_argument(
        "--log-format", choices=("console", "json"), help="log as text (default) or JSON lines"
    )
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), help="default info"
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {
        "server.host": args.host,
        "server.port": args.port,
        "server.data_dir": args.data_dir,
        "server.node_id": args.node_id,
        "amqp.port": args.amqp_port,
        "amqp.host": args.amqp_host,
        "http.port": args.http_port,
        "http.host": args.http_host,
        "http.tls": args.http_tls,
        "http.allowed_origins": args.http_allow_origin,
        "server.tls": args.tls,
        "amqp.tls": args.amqp_tls,
        "tls.cert": args.tls_cert,
        "tls.key": args.tls_key,
        "tls.ca": args.tls_ca,
        "tls.verify": args.tls_verify,
        "tls.min_version": args.tls_min_version,
        "cluster.role": _role(args),
        "storage.fsync": args.fsync,
        "storage.batch_ms": args.batch_ms,
        "storage.persist": False if args.in_memory else None,
        "log.format": args.log_format,
        "log.level": args.log_level,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def _role(args: argparse.Namespace) -> str | None:
    if getattr(args, "is_primary", None) == "1":
        return "primary"
    if getattr(args, "is_backup", None) == "1":
        return "backup"
    return None


def run_server(args: argparse.Namespace) -> int:
    """Entry point of ``amqlite server``; returns the exit status."""
    try:
        config = load_config(args.config, _overrides(args))
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    configure_logging(config.log.format, config.log.level)
    gc.set_threshold(*GC_THRESHOLDS)
    _raise_open_files_limit(config)
    cannot_listen: list[OSError] = []
    store_errors: list[StoreError] = []
    try:
        trio.run(_serve_until_signalled, config)
    except* StoreError as group:  # locked, corrupt or unwritable data dir
        store_errors.extend(e for e in _leaves(group) if isinstance(e, StoreError))
    except* OSError as group:  # the bind fails inside a nursery, so it comes grouped
        cannot_listen.extend(e for e in _leaves(group) if isinstance(e, OSError))
    for error in store_errors:
        print(f"amqlite: error: {error}", file=sys.stderr)
    if store_errors:
        return 1
    for failure in cannot_listen:
        if isinstance(failure, CannotListen):
            flag = "--http-port" if failure.where.startswith("HTTP") else "--amqp-port"
            hint = f" (another broker, e.g. RabbitMQ, may hold it: pick another with {flag})"
            print(f"amqlite: error: {failure.strerror}{hint}", file=sys.stderr)
        else:
            cfg = config.server
            where = f"{cfg.host}:{cfg.port}"
            print(f"amqlite: error: cannot listen on {where}: {failure}", file=sys.stderr)
    if cannot_listen:
        return 1
    return 0


def _raise_open_files_limit(config: Config) -> None:
    """Lift the soft limit on open files to the hard one (often 1024 against
    several thousand): every connection, pending or open, is a descriptor, and so
    are journal segments. Warn when even the hard limit leaves no room for
    ``limits.max_connections`` and ``limits.max_unauthenticated_connections``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("open_files_limit_unchanged", soft=soft, hard=hard, error=str(exc))
    limits = config.limits
    needed = limits.max_connections + limits.max_unauthenticated_connections + FILES_RESERVED
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "open_files_limit_low",
            limit=soft,
            needed=needed,
            hint="raise the hard limit (ulimit -Hn, LimitNOFILE=) or lower "
            "limits.max_connections / limits.max_unauthenticated_connections: past the "
            "limit new connections fail at accept",
        )


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    """The exceptions inside ``group`` and the groups nested in it (nurseries nest)."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out


async def _serve_until_signalled(config: Config) -> None:
    node = BrokerNode(config)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("signal_received", signal=signal.Signals(signum).name)
                    node.stop()
                    return

            nursery.start_soon(stop_on_signal)
            await node.stopped.wait()
            nursery.cancel_scope.cancel()
