"""Config loading: defaults, the shipped file, overrides, and every refusal naming its key."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from amqlite.auth import hash_password, verify_password
from amqlite.config import (
    AmqpConfig,
    Config,
    HttpConfig,
    LimitsConfig,
    LogConfig,
    PeeringConfig,
    ServerConfig,
    StorageConfig,
    TlsConfig,
    UserConfig,
    VhostPermissions,
    load_config,
)
from amqlite.errors import ConfigError
from amqlite.peering import Address, OverflowPolicy, PeeringMode

SHIPPED_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "amq_server.toml"
FAST_HASH = hash_password("secret", salt=b"0123456789abcdef", n=2**4)


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "amq.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def user_block(name: str = "app", password_hash: str = FAST_HASH, vhost: str = "/") -> str:
    return f"""
    [[users]]
    name = "{name}"
    password_hash = "{password_hash}"
    [users.permissions."{vhost}"]
    configure = ".*"
    write = ".*"
    read = ".*"
    """


def test_no_file_gives_the_defaults() -> None:
    config = load_config()
    assert config == Config.default()
    assert config.server == ServerConfig(
        host="127.0.0.1",
        port=5555,
        node_id="",
        data_dir="",
        max_frame_bytes=4 * 1024 * 1024,
        heartbeat=5.0,
        vhosts=("/",),
    )
    assert config.storage == StorageConfig(
        persist=True, fsync="batch", batch_ms=10.0, segment_bytes=64 * 1024 * 1024
    )
    assert config.log == LogConfig(format="console", level="info")
    assert config.users == ()


def test_shipped_config_is_exactly_the_defaults() -> None:
    assert load_config(SHIPPED_CONFIG) == Config.default()


def test_shipped_config_documents_every_key() -> None:
    text = SHIPPED_CONFIG.read_text(encoding="utf-8")
    for table in (ServerConfig, StorageConfig, AmqpConfig, TlsConfig, LimitsConfig, LogConfig):
        for item in dataclasses.fields(table):
            assert re.search(rf"^(# )?{item.name} = ", text, re.MULTILINE), item.name
    for key in ("[[users]]", "name", "password_hash", "tags", "[users.permissions.", "configure"):
        assert f"# {key}" in text, key


def test_shipped_users_example_loads_once_uncommented(tmp_path: Path) -> None:
    text = SHIPPED_CONFIG.read_text(encoding="utf-8")
    example = text[text.index("# [[users]]") :]
    uncommented = "\n".join(line.removeprefix("# ") for line in example.splitlines())
    uncommented = uncommented.replace("scrypt$16384$8$1$<salt>$<hash>", FAST_HASH)

    config = load_config(write_config(tmp_path, uncommented))

    (user,) = config.users
    assert user.name == "app"
    assert user.tags == ()
    grant = user.permissions_for("/")
    assert grant == VhostPermissions("/", configure=r"app\..*", write=".*", read=".*")


def test_full_file_is_parsed_into_dataclasses(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        f"""
        [server]
        host = "0.0.0.0"
        port = 6000
        node_id = "site-a-1"
        data_dir = "/var/lib/amqlite"
        max_frame_bytes = 4096
        heartbeat = 1
        vhosts = ["/", "prod"]
        [log]
        format = "json"
        level = "debug"
        {user_block(vhost="prod")}
        [users.permissions."/"]
        read = "reports\\\\..*"
        """,
    )

    config = load_config(path)

    assert config.server == ServerConfig(
        host="0.0.0.0",
        port=6000,
        node_id="site-a-1",
        data_dir="/var/lib/amqlite",
        max_frame_bytes=4096,
        heartbeat=1.0,
        vhosts=("/", "prod"),
    )
    assert isinstance(config.server.heartbeat, float)
    assert config.log == LogConfig("json", "debug")
    assert config.users == (
        UserConfig(
            "app",
            FAST_HASH,
            (
                VhostPermissions("prod", ".*", ".*", ".*"),
                VhostPermissions("/", configure="", write="", read=r"reports\..*"),
            ),
        ),
    )
    assert verify_password("secret", config.users[0].password_hash)


def test_user_tags_are_parsed(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        f"""
        [[users]]
        name = "ops"
        password_hash = "{FAST_HASH}"
        tags = ["monitoring", "administrator"]
        [[users]]
        name = "pair"
        password_hash = "{FAST_HASH}"
        tags = ["cluster"]
        [cluster]
        role = "primary"
        login = "pair"
        """,
    )
    ops, pair = load_config(path).users
    assert ops.tags == ("monitoring", "administrator")
    assert pair.tags == ("cluster",)
    assert ops.permissions == ()


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        """
        [server]
        port = 6000
        host = "0.0.0.0"
        [log]
        format = "console"
        """,
    )

    config = load_config(path, {"server.port": 0, "log.format": "json", "server.host": None})

    assert config.server.port == 0
    assert config.log.format == "json"
    assert config.server.host == "0.0.0.0"


def test_overrides_without_a_file_start_from_the_defaults() -> None:
    config = load_config(None, {"server.data_dir": "/tmp/x", "log.level": "debug"})
    assert config == Config(
        server=ServerConfig(data_dir="/tmp/x"), log=LogConfig(level="debug"), users=()
    )


def test_overrides_are_validated_like_the_file() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"server.port": "5555"})
    assert caught.value.key == "server.port"
    assert caught.value.reason == "must be an integer, got str"


def test_config_is_frozen_and_replace_derives_variants() -> None:
    config = Config.default()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.server.port = 1  # type: ignore[misc]
    test_config = dataclasses.replace(config, server=dataclasses.replace(config.server, port=0))
    assert test_config.server.port == 0
    assert config.server.port == 5555
    assert hash(config) == hash(Config.default())


@pytest.mark.parametrize(
    ("server", "bound_port", "expected"),
    [
        (ServerConfig(), None, "127.0.0.1:5555"),
        (ServerConfig(port=0), 40123, "127.0.0.1:40123"),
        (ServerConfig(host="::1", port=7000), None, "[::1]:7000"),
        (ServerConfig(node_id="primary"), 40123, "primary"),
    ],
)
def test_effective_node_id(server: ServerConfig, bound_port: int | None, expected: str) -> None:
    assert server.effective_node_id(bound_port) == expected


def test_error_message_names_key_and_reason() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"server.port": 70000})
    assert str(caught.value) == "config error: server.port: must be between 0 and 65535, got 70000"


PEER = "[[cluster_mta]]\nname = 'x'\nhost = '127.0.0.1:6001'\n"

BAD_FILES: list[tuple[str, str, str]] = [
    # (file text, key, reason fragment)
    ("[server]\nprot = 5555", "server.prot", "unknown key (did you mean 'port'?)"),
    ("[server]\nbogus = 1", "server.bogus", "unknown key"),
    ("[logg]\nlevel = 'info'", "logg", "unknown key (did you mean 'log'?)"),
    ("[cluster]\nname = 'a'", "cluster.name", "unknown key"),
    ("[cluster]\nrole = 'master'", "cluster.role", "must be one of"),
    ("[cluster]\nprimary_peer = 'localhost'", "cluster.primary_peer", "must be host:port"),
    ("[cluster]\nbackup_peer = 'h:70000'", "cluster.backup_peer", "must be host:port"),
    ("[cluster]\nheartbeat_ms = 5", "cluster.heartbeat_ms", "between 10"),
    (
        "[cluster]\nheartbeat_ms = 500\nfailover_timeout_ms = 400",
        "cluster.failover_timeout_ms",
        "longer than",
    ),
    ("[cluster]\nrole = 'primary'\nvhost = 'nope'", "cluster.vhost", "unknown vhost"),
    (
        "[cluster]\nrole = 'backup'\nbackup_peer = '127.0.0.1:5555'",
        "cluster.backup_peer",
        "must differ",
    ),
    ("[cluster]\nwitness = 'nowhere'", "cluster.witness", "must be host:port"),
    (
        "[cluster]\nrole = 'primary'\nwitness = '127.0.0.1:6666'",
        "cluster.witness",
        "must differ from both",
    ),
    ("[cluster]\non_peer_silence = 'wait'", "cluster.on_peer_silence", "'serve', 'hold'"),
    ("[cluster]\nhold_timeout_ms = 5", "cluster.hold_timeout_ms", "between 100"),
    ("[[cluster_mta]]\nhost = 'h:1'\nmode = 1", "cluster_mta[0].name", "is required"),
    ("[[cluster_mta]]\nname = 'x'\nmode = 1", "cluster_mta[0].host", "is required"),
    ("[[cluster_mta]]\nname = 'x'\nhost = 'h:1'", "cluster_mta[0].mode", "is required"),
    (PEER + "mode = 4", "cluster_mta[0].mode", "expected 1 or 'subscribe'"),
    (PEER + "mode = 'mirror'", "cluster_mta[0].mode", "got 'mirror'"),
    (PEER + "mode = true", "cluster_mta[0].mode", "expected 1"),
    (PEER + "mode = 2\noverflow = 'discard'", "cluster_mta[0].overflow", "'drop-oldest'"),
    (PEER + "mode = 2\nmax_hops = 0", "cluster_mta[0].max_hops", "between 1 and 255"),
    (PEER + "mode = 2\nbuffer_bytes = 10", "cluster_mta[0].buffer_bytes", "at least 1024"),
    (PEER + "mode = 1\nlease = 0", "cluster_mta[0].lease", "at least 0.1"),
    (PEER + "mode = 1\nlease = '1d'", "cluster_mta[0].lease", "must be a number, got str"),
    (PEER + "mode = 2\nvhost = 'prod'", "cluster_mta[0].vhost", "unknown vhost 'prod'"),
    (PEER + "mode = 2\ntype = 'stream'", "cluster_mta[0].type", "must be one of"),
    (PEER + "mode = 2\nmodes = 2", "cluster_mta[0].modes", "did you mean 'mode'"),
    (PEER + "mode = 2\nlogin = ''", "cluster_mta[0].login", "must not be empty"),
    (
        "[[cluster_mta]]\nname = 'x'\nmode = 2\nhost = 'localhost'",
        "cluster_mta[0].host",
        "expected 'host:port'",
    ),
    (
        "[[cluster_mta]]\nname = 'x'\nmode = 2\nhost = 'a:1,b:99999'",
        "cluster_mta[0].host",
        "port must be 1-65535",
    ),
    ("[[cluster_mta]]\nname = 'x'\nmode = 2\nhost = ','", "cluster_mta[0].host", "at least one"),
    (PEER + "mode = 2\n" + PEER + "mode = 1", "cluster_mta[1].host", "duplicate link"),
    ("[cluster_mta]\nname = 'x'", "cluster_mta", "must be an array of tables"),
    ("[storage]\nfsync = true", "storage.fsync", "must be a string"),
    ("[storage]\nfsync = 'sometimes'", "storage.fsync", "must be one of"),
    ("[storage]\npersist = 1", "storage.persist", "must be true or false"),
    ("[storage]\nbatch_ms = 0", "storage.batch_ms", "at least"),
    ("[storage]\nsegment_bytes = 100", "storage.segment_bytes", "at least"),
    ("[storage]\nfsynk = 'always'", "storage.fsynk", "did you mean 'fsync'"),
    ("server = 1", "server", "must be a table, got int"),
    ("[server]\nport = '5555'", "server.port", "must be an integer, got str"),
    ("[server]\nport = 5555.0", "server.port", "must be an integer, got float"),
    ("[server]\nport = true", "server.port", "must be an integer, got bool"),
    ("[server]\nport = -1", "server.port", "must be between 0 and 65535, got -1"),
    ("[server]\nport = 65536", "server.port", "must be between 0 and 65535, got 65536"),
    ("[server]\nhost = ''", "server.host", "must not be empty"),
    ("[server]\nhost = 127", "server.host", "must be a string, got int"),
    ("[server]\nnode_id = 1", "server.node_id", "must be a string, got int"),
    ("[server]\nmax_frame_bytes = 4095", "server.max_frame_bytes", "must be at least 4096"),
    ("[server]\nheartbeat = -0.5", "server.heartbeat", "must be at least 0, got -0.5"),
    ("[server]\nheartbeat = 'fast'", "server.heartbeat", "must be a number, got str"),
    ("[server]\nheartbeat = inf", "server.heartbeat", "must be a finite number"),
    ("[server]\nheartbeat = nan", "server.heartbeat", "must be a finite number"),
    (
        "[server]\nmax_connections = 5",
        "server.max_connections",
        "has moved: set limits.max_connections instead",
    ),
    ("[limits]\nmax_connections = 0", "limits.max_connections", "must be at least 1"),
    ("[limits]\nmax_connections_per_user = -1", "limits.max_connections_per_user", "at least 0"),
    (
        "[limits]\nmax_unauthenticated_connections = 0",
        "limits.max_unauthenticated_connections",
        "must be at least 1",
    ),
    ("[limits]\nhandshake_timeout = 0", "limits.handshake_timeout", "must be at least 0.1"),
    (
        "[limits]\nmax_message_size = 536870913",
        "limits.max_message_size",
        "must be between 1 and 536870912",
    ),
    ("[limits]\nmax_queues_per_vhost = 1.5", "limits.max_queues_per_vhost", "integer"),
    ("[server]\nvhosts = '/'", "server.vhosts", "must be an array of strings, got str"),
    ("[server]\nvhosts = []", "server.vhosts", "must not be empty"),
    ("[server]\nvhosts = ['/', '']", "server.vhosts[1]", "must not be empty"),
    ("[server]\nvhosts = ['/', 2]", "server.vhosts[1]", "must be a string, got int"),
    ("[server]\nvhosts = ['/', 'a', '/']", "server.vhosts[2]", "duplicate vhost '/'"),
    ("[log]\nformat = 'xml'", "log.format", "must be one of 'console', 'json', got 'xml'"),
    ("[log]\nlevel = 'trace'", "log.level", "must be one of 'debug', 'info', 'warning', 'error'"),
    ("[log]\nlevel = 10", "log.level", "must be a string, got int"),
    ("[users]\nname = 'a'", "users", "must be an array of tables, got table"),
    ("[[users]]\npassword_hash = 'x'", "users[0].password_hash", "not a valid scrypt$ hash"),
    (f"[[users]]\npassword_hash = '{FAST_HASH}'", "users[0].name", "is required"),
    ("[[users]]\nname = 'a'", "users[0].password_hash", "is required"),
    ("[[users]]\nname = ''", "users[0].name", "must not be empty"),
    (
        f"[[users]]\nname='a'\npasword_hash='{FAST_HASH}'",
        "users[0].pasword_hash",
        "'password_hash'",
    ),
    (
        f"[[users]]\nname = 'a'\npassword_hash = '{FAST_HASH[:-3]}'",
        "users[0].password_hash",
        "not a valid scrypt$ hash",
    ),
    (
        "[[users]]\nname = 'a'\npassword_hash = 'bcrypt$2b$12$abcdefghijklmnopqrstuv'",
        "users[0].password_hash",
        "amqlite passwd",
    ),
    (user_block() + user_block(), "users[1].name", "duplicate user 'app'"),
    (
        f"[[users]]\nname='a'\npassword_hash='{FAST_HASH}'\ntags=['monitoring', 'admin']",
        "users[0].tags[1]",
        "unknown tag 'admin' (known: 'administrator', 'monitoring', 'management', 'cluster', "
        "'peering')",
    ),
    (
        f"[[users]]\nname='a'\npassword_hash='{FAST_HASH}'\ntags=['cluster', 'cluster']",
        "users[0].tags[1]",
        "duplicate tag 'cluster'",
    ),
    (
        f"[[users]]\nname='a'\npassword_hash='{FAST_HASH}'\ntags='administrator'",
        "users[0].tags",
        "must be an array of tags, got str",
    ),
    (
        f"[[users]]\nname='a'\npassword_hash='{FAST_HASH}'\ntags=[1]",
        "users[0].tags[0]",
        "must be a string, got int",
    ),
    (
        "[cluster]\nrole = 'primary'\nlogin = 'app'\n" + user_block(),
        "cluster.login",
        "user 'app' opens the HA peer link but lacks the 'cluster' tag (add it to users[0].tags)",
    ),
    (user_block(vhost="/x"), 'users[0].permissions."/x"', "unknown vhost '/x'"),
    (
        user_block() + "[users.permissions.prod]\nwrite = '.*'",
        "users[0].permissions.prod",
        "unknown vhost 'prod'",
    ),
    (
        user_block() + '[users.permissions."/".extra]\nx = 1',
        'users[0].permissions."/".extra',
        "unknown key",
    ),
    (
        f"[[users]]\nname='a'\npassword_hash='{FAST_HASH}'\n[users.permissions.\"/\"]\nwrite='('",
        'users[0].permissions."/".write',
        "invalid regex '('",
    ),
    (
        f"[[users]]\nname='a'\npassword_hash='{FAST_HASH}'\n[users.permissions.\"/\"]\nread=1",
        'users[0].permissions."/".read',
        "must be a string, got int",
    ),
    (
        f"[[users]]\nname='a'\npassword_hash='{FAST_HASH}'\n[users.permissions.\"/\"]\nreed='.*'",
        'users[0].permissions."/".reed',
        "unknown key (did you mean 'read'?)",
    ),
    (
        f"[[users]]\nname='a'\npassword_hash='{FAST_HASH}'\npermissions = ['/']",
        "users[0].permissions",
        "must be a table, got array",
    ),
    (
        f"[[users]]\nname='a'\npassword_hash='{FAST_HASH}'\npermissions = {{'/' = '.*'}}",
        'users[0].permissions."/"',
        "must be a table, got str",
    ),
]


@pytest.mark.parametrize(("text", "key", "reason"), BAD_FILES)
def test_bad_config_names_the_key(tmp_path: Path, text: str, key: str, reason: str) -> None:
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == key
    assert reason in caught.value.reason


BAD_OVERRIDES: list[tuple[dict[str, Any], str, str]] = [
    ({"server.prot": 1}, "server.prot", "unknown key (did you mean 'port'?)"),
    ({"cluster.name": "a"}, "cluster.name", "unknown key"),
    ({"server.port.x": 1}, "server.port", "must be an integer, got table"),
    ({"server..port": 1}, "server..port", "dotted names"),
    ({"log.format": "JSON"}, "log.format", "got 'JSON'"),
    ({"server.vhosts": ("/", "/")}, "server.vhosts[1]", "duplicate vhost '/'"),
]


@pytest.mark.parametrize(("overrides", "key", "reason"), BAD_OVERRIDES)
def test_bad_override_names_the_key(overrides: dict[str, Any], key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    assert caught.value.key == key
    assert reason in caught.value.reason


def test_override_can_fix_what_the_file_gets_wrong(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[server]\nport = 'oops'")
    assert load_config(path, {"server.port": 7000}).server.port == 7000


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == str(path)
    assert "cannot read file" in caught.value.reason
    assert "No such file" in caught.value.reason


def test_directory_is_unreadable_as_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(str(tmp_path))
    assert caught.value.key == str(tmp_path)
    assert "cannot read file" in caught.value.reason


def test_toml_syntax_error_carries_the_parser_message(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[server]\nport = \n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == str(path)
    assert caught.value.reason.startswith("invalid TOML: ")
    assert "line 2" in caught.value.reason


def test_non_utf8_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"[server]\nhost = '\xe9'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == str(path)
    assert "not UTF-8" in caught.value.reason


def test_override_cannot_reach_inside_a_value(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[server]\nport = 6000")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {"server.port.x": 1})
    assert caught.value.key == "server.port"
    assert caught.value.reason == "is not a table; cannot override in it"


@pytest.mark.parametrize(
    ("toml_vhost", "key"),
    [
        ("my vhost", 'users[0].permissions."my vhost"'),
        ('we\\"ird', 'users[0].permissions."we\\"ird"'),
        ("plain_name-1", "users[0].permissions.plain_name-1"),
    ],
)
def test_vhost_names_needing_quotes_are_quoted_in_keys(
    tmp_path: Path, toml_vhost: str, key: str
) -> None:
    path = write_config(tmp_path, user_block(vhost=toml_vhost))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == key
    assert "unknown vhost" in caught.value.reason


def test_cluster_mta_entries_are_parsed_with_their_defaults(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        """
        [[cluster_mta]]
        name = "orders"
        host = "10.0.0.1:5555,10.0.0.2:6666"
        password = "s3cret"
        mode = 1

        [[cluster_mta]]
        name = "orders"
        host = "10.0.0.3:5555"
        mode = "Publish"
        login = "site-a"
        max_hops = 3
        buffer_bytes = 65536
        overflow = "drop_oldest"
        heartbeat = 0.5
        type = "direct"

        [[cluster_mta]]
        name = "amq.topic"
        host = "[::1]:7000"
        mode = "3"
        overflow = "spill"
        """,
    )
    first, second, third = load_config(path).cluster_mta
    assert first == PeeringConfig(
        name="orders",
        host=(Address("10.0.0.1", 5555), Address("10.0.0.2", 6666)),
        mode=PeeringMode.SUBSCRIBE,
        password="s3cret",
    )
    assert (first.vhost, first.login, first.max_hops) == ("/", "peering", 8)
    assert (first.buffer_bytes, first.overflow) == (16 * 1024 * 1024, OverflowPolicy.BLOCK)
    assert first.hosts == "10.0.0.1:5555,10.0.0.2:6666"
    assert "s3cret" not in repr(first)
    assert second.mode is PeeringMode.PUBLISH
    assert (second.login, second.max_hops, second.buffer_bytes) == ("site-a", 3, 65536)
    assert (second.overflow, second.heartbeat, second.type) == (
        OverflowPolicy.DROP_OLDEST,
        0.5,
        "direct",
    )
    assert third.mode is PeeringMode.FORWARD
    assert third.overflow is OverflowPolicy.SPILL
    assert third.host == (Address("::1", 7000),)


def test_amqp_is_off_unless_a_port_is_given(tmp_path: Path) -> None:
    assert not Config.default().amqp.enabled
    config = load_config(overrides={"amqp.port": 0})
    assert config.amqp.enabled and config.amqp.port == 0
    assert config.amqp.listen_host(config.server) == "127.0.0.1"
    text = '[amqp]\nport = 5673\nhost = "::1"\nheartbeat = 0\nframe_max = 8192\n'
    config = load_config(write_config(tmp_path, text))
    assert config.amqp == AmqpConfig(port=5673, host="::1", heartbeat=0.0, frame_max=8192)
    assert config.amqp.listen_host(config.server) == "::1"


@pytest.mark.parametrize(
    ("overrides", "key", "reason"),
    [
        ({"amqp.port": 70000}, "amqp.port", "between 0 and 65535"),
        ({"amqp.frame_max": 100}, "amqp.frame_max", "between 4096"),
        ({"amqp.channel_max": 0}, "amqp.channel_max", "between 1 and 65535"),
        ({"amqp.prot": 1}, "amqp.prot", "did you mean 'port'"),
    ],
)
def test_bad_amqp_settings_name_the_key(overrides: dict[str, Any], key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    assert info.value.key == key
    assert reason in str(info.value)


def test_http_is_off_unless_a_port_is_given(tmp_path: Path) -> None:
    assert not Config.default().http.enabled
    config = load_config(overrides={"http.port": 0})
    assert config.http.enabled and config.http.port == 0
    assert config.http.listen_host(config.server) == "127.0.0.1"
    config = load_config(write_config(tmp_path, '[http]\nport = 15672\nhost = "0.0.0.0"\n'))
    assert config.http == HttpConfig(port=15672, host="0.0.0.0")
    assert config.http.listen_host(config.server) == "0.0.0.0"


@pytest.mark.parametrize(
    ("overrides", "key", "reason"),
    [
        ({"http.port": -1}, "http.port", "between 0 and 65535"),
        ({"http.tls": True}, "tls.cert", "http.tls = true serves TLS"),
        ({"http.prot": 1}, "http.prot", "did you mean 'port'"),
        ({"http.allowed_origins": "http://a"}, "http.allowed_origins", "array of origins"),
        ({"http.allowed_origins": ["a.example"]}, "http.allowed_origins[0]", "not an origin"),
        ({"http.allowed_origins": ["http://a/x"]}, "http.allowed_origins[0]", "not an origin"),
        ({"http.poll_idle": 0}, "http.poll_idle", "at least 0.1"),
    ],
)
def test_bad_http_settings_name_the_key(overrides: dict[str, Any], key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    assert info.value.key == key
    assert reason in str(info.value)


def test_allowed_origins_for_the_browser_channels(tmp_path: Path) -> None:
    assert Config.default().http.allowed_origins == ()
    text = '[http]\nallowed_origins = ["https://App.example/", "http://127.0.0.1:8000"]\n'
    config = load_config(write_config(tmp_path, text))
    assert config.http.allowed_origins == ("https://app.example", "http://127.0.0.1:8000")
    assert config.http.poll_idle == 30.0


def test_limits_default_to_rabbitmqs() -> None:
    limits = Config.default().limits
    assert limits == LimitsConfig(memory_high_watermark=0.4, disk_free_limit=50_000_000)
    assert limits.memory_limit(1000) == 400


def test_limits_take_a_fraction_or_bytes(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "[limits]\nmemory_high_watermark = 0.25\n"))
    assert config.limits.memory_limit(8_000) == 2_000
    text = "[limits]\nmemory_high_watermark = 67108864\ndisk_free_limit = 0\n"
    config = load_config(write_config(tmp_path, text))
    assert config.limits.memory_limit(8_000) == 67_108_864  # bytes: RAM does not matter
    assert config.limits.disk_free_limit == 0
    assert load_config(overrides={"limits.memory_high_watermark": 1}).limits.memory_limit(9) == 1


@pytest.mark.parametrize(
    ("overrides", "key", "reason"),
    [
        ({"limits.memory_high_watermark": 0}, "limits.memory_high_watermark", "fraction"),
        ({"limits.memory_high_watermark": -0.5}, "limits.memory_high_watermark", "at least 0"),
        ({"limits.memory_high_watermark": 1.5}, "limits.memory_high_watermark", "whole number"),
        ({"limits.memory_high_watermark": "40%"}, "limits.memory_high_watermark", "a number"),
        ({"limits.disk_free_limit": -1}, "limits.disk_free_limit", "at least 0"),
        ({"limits.disk_free_limit": 1.5}, "limits.disk_free_limit", "an integer"),
        ({"limits.disk_free": 1}, "limits.disk_free", "did you mean 'disk_free_limit'"),
    ],
)
def test_bad_limits_name_the_key(overrides: dict[str, Any], key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    assert info.value.key == key
    assert reason in str(info.value)


def test_no_cluster_mta_means_no_links() -> None:
    assert load_config().cluster_mta == ()


@pytest.mark.parametrize(("site", "other"), [("site-a", 7002), ("site-b", 7001)])
def test_shipped_site_configs_peer_with_each_other(site: str, other: int) -> None:
    config = load_config(SHIPPED_CONFIG.parent / f"{site}.toml")
    assert config.server.node_id == site
    assert config.cluster_mta
    for link in config.cluster_mta:
        assert link.host == (Address("127.0.0.1", other),)
    first = config.cluster_mta[0]
    assert (first.name, first.mode) == ("events", PeeringMode.PUBLISH)
