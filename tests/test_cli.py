"""``amqlite`` commands against a real broker running in another process.

Most commands run in-process through ``main([...])`` (capsys sees their output);
a few run as ``python -m amqlite`` to check exit statuses and one-line errors as a
shell would see them. Every queue name is unique to its test.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqlite.auth import verify_password
from amqlite.cli import main, parse_scalar
from amqlite.config import load_config
from tests.waiting import poll_until

_names = itertools.count()


def _name(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``amqlite server`` on 127.0.0.1, port 0, in a child process."""
    data_dir = tmp_path_factory.mktemp("broker")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "amqlite",
            "server",
            "--port",
            "0",
            "--log-format",
            "json",
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(30, proc.kill)  # a server that never says it listens
    watchdog.start()
    port = None
    assert proc.stderr is not None
    for line in proc.stderr:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "server_listening":
            port = event["port"]
            break
    watchdog.cancel()
    assert port is not None, "the server did not start"
    stderr = proc.stderr
    drain = threading.Thread(target=lambda: [None for _ in stderr], daemon=True)
    drain.start()
    yield f"127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        proc.kill()
        proc.wait()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_process(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amqlite", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_publish_confirm_count_then_consume(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = _name("jobs")
    assert run(capsys, "declare", "queue", q, "-s", server)[0] == 0
    code, _, err = run(
        capsys, "publish", "-s", server, "-k", q, "--confirm", "--count", "5", "job {n}"
    )
    assert (code, err) == (0, "published 5 confirmed 5\n")
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--count", "3")
    assert (code, out) == (0, "job 1\njob 2\njob 3\n")
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--timeout", "0.3")
    assert (code, out) == (0, "job 4\njob 5\n")  # 1-3 were acked, 4-5 left for us


def test_publish_numbers_text_headers_and_properties_like_the_body(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = _name("numbered")
    run(capsys, "declare", "queue", q, "-s", server)
    code, _, err = run(
        capsys, "publish", "-s", server, "-k", q, "--count", "3", "--confirm",
        "-P", "message_id=order-{n}", "-P", "priority=2", "-H", "batch=b{n}", "-H", "site=eu",
        "body {n}",
    )  # fmt: skip
    assert (code, err) == (0, "published 3 confirmed 3\n")
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--count", "3", "--json")
    got = [json.loads(line) for line in out.splitlines()]
    assert [m["properties"]["message_id"] for m in got] == ["order-1", "order-2", "order-3"]
    assert [m["properties"]["priority"] for m in got] == [2, 2, 2]
    assert [m["headers"] for m in got] == [{"batch": f"b{n}", "site": "eu"} for n in (1, 2, 3)]


def test_publish_without_confirm(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = _name("plain")
    run(capsys, "declare", "queue", q, "-s", server)
    code, _, err = run(capsys, "publish", "-s", server, "-k", q, "--count", "100", "m{n}")
    assert (code, err) == (0, "published 100\n")
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--count", "100")
    assert out.split() == [f"m{i}" for i in range(1, 101)]


def test_mandatory_unroutable(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys,
        "publish",
        "-s",
        server,
        "-e",
        "amq.direct",
        "-k",
        _name("none"),
        "--mandatory",
        "--confirm",
        "--count",
        "2",
        "x",
    )
    assert code == 1
    assert err.splitlines() == ["published 2 confirmed 0", "2 returned (no queue took them)"]
    code, _, err = run(
        capsys, "publish", "-s", server, "-e", "amq.direct", "-k", _name("none"), "--mandatory", "x"
    )
    assert code == 1
    assert err.splitlines() == ["published 1", "1 returned (no queue took them)"]


@pytest.mark.parametrize("confirm", [[], ["--confirm"]])
def test_unknown_exchange_is_one_line(
    server: str, capsys: pytest.CaptureFixture[str], confirm: list[str]
) -> None:
    code, _, err = run(capsys, "publish", "-s", server, "-e", "nope", "-k", "k", *confirm, "x")
    assert code == 1
    assert err == "amqlite: error: 404 NOT_FOUND: no exchange 'nope' in vhost '/'\n"


def test_unknown_exchange_as_a_process(server: str) -> None:
    result = run_process("publish", "-s", server, "-e", "nope", "x")
    assert result.returncode == 1
    assert result.stderr == "amqlite: error: 404 NOT_FOUND: no exchange 'nope' in vhost '/'\n"


def test_publish_from_stdin(
    server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    q = _name("lines")
    run(capsys, "declare", "queue", q, "-s", server)
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\ntwo {n}\r\n\nlast"))
    code, _, err = run(capsys, "publish", "-s", server, "-k", q, "--confirm", "-")
    assert (code, err) == (0, "published 4 confirmed 4\n")
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--json", "--count", "4")
    assert [json.loads(line)["body"] for line in out.splitlines()] == ["one", "two {n}", "", "last"]


def test_publish_stdin_in_a_pipe(server: str) -> None:
    q = _name("piped")
    assert run_process("declare", "queue", q, "-s", server).returncode == 0
    result = run_process("publish", "-s", server, "-k", q, "-", stdin="a\nb\nc\n")
    assert (result.returncode, result.stderr) == (0, "published 3\n")


def test_consume_json_headers_and_binary(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = _name("json")
    run(capsys, "declare", "queue", q, "-s", server)
    code, _, _ = run(
        capsys,
        "publish",
        "-s",
        server,
        "-k",
        q,
        "-H",
        "n=3",
        "-H",
        "ok=true",
        "-H",
        "f=1.5",
        "-H",
        "who=eve",
        "-P",
        "message_id=m1",
        "--persistent",
        "--confirm",
        "héllo",
    )
    assert code == 0
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--json", "--count", "1")
    record = json.loads(out)
    assert record == {
        "exchange": "",
        "routing_key": q,
        "headers": {"n": 3, "ok": True, "f": 1.5, "who": "eve"},
        "properties": {"message_id": "m1", "persistent": True},
        "body": "héllo",
        "redelivered": False,
    }


def test_consume_binary_body_as_base64(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    import trio

    import amqlite

    q = _name("bin")

    async def put() -> None:
        async with amqlite.connect(server) as conn:
            await conn.declare_queue(q)
            await conn.publish("", q, b"\xff\x00", confirm=True)

    trio.run(put)
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--json", "--count", "1")
    assert code == 0
    record = json.loads(out)
    assert record["body_b64"] == "/wA=" and "body" not in record


def test_consume_timeout_on_an_empty_queue(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = _name("empty")
    run(capsys, "declare", "queue", q, "-s", server)
    start = time.monotonic()
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--timeout", "0.2")
    assert (code, out) == (0, "")
    assert time.monotonic() - start < 10


def test_consume_from_an_exchange(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    """-e/-k: a private queue bound for the command's lifetime (a child process here,
    so this test can publish while it waits)."""
    ex = _name("events")
    assert run(capsys, "declare", "exchange", ex, "topic", "-s", server)[0] == 0
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "amqlite",
            "consume",
            "-s",
            server,
            "-e",
            ex,
            "-k",
            "orders.#",
            "--count",
            "2",
            "--timeout",
            "20",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:  # until the child's queue is bound (bounded; each poll is a round trip)
            _, out, _ = run(capsys, "status", "-s", server, "--json")
            exchanges = [x for v in json.loads(out)["vhosts"] for x in v["exchanges"]]
            if any(x["name"] == ex and x["bindings"] for x in exchanges):
                break
            assert time.monotonic() < deadline, "the consumer never bound its queue"
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
        for key in ("orders.eu", "other", "orders.us.new"):
            assert run(capsys, "publish", "-s", server, "-e", ex, "-k", key, key)[0] == 0
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:  # pragma: no cover
            child.kill()
            child.wait()
    assert (child.returncode, out, err) == (0, "orders.eu\norders.us.new\n", "")


def test_declare_bind_and_status_json(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    ex, q = _name("ex"), _name("q")
    code, out, _ = run(capsys, "declare", "exchange", ex, "direct", "--durable", "-s", server)
    assert (code, out) == (0, f"declared exchange '{ex}' (direct)\n")
    code, out, _ = run(
        capsys,
        "declare",
        "queue",
        q,
        "--durable",
        "--arg",
        "x-max-length=10",
        "--type",
        "classic",
        "-s",
        server,
    )
    assert (code, out) == (0, f"declared queue '{q}' (0 messages, 0 consumers)\n")
    code, out, _ = run(capsys, "bind", ex, q, "rk", "-s", server)
    assert (code, out) == (0, f"bound queue '{q}' to exchange '{ex}' with key 'rk'\n")
    code, out, _ = run(capsys, "status", "--json", "-s", server)
    status = json.loads(out)
    assert status["state"] == "standalone"
    (vhost,) = status["vhosts"]
    (exchange,) = [x for x in vhost["exchanges"] if x["name"] == ex]
    assert exchange["type"] == "direct" and exchange["durable"]
    assert [(b["queue"], b["key"]) for b in exchange["bindings"]] == [(q, "rk")]
    (queue,) = [x for x in vhost["queues"] if x["name"] == q]
    assert queue["durable"] and queue["arguments"]["x-max-length"] == 10
    assert queue["arguments"]["x-queue-type"] == "classic"
    # the same queue in the flat list beside the nested one, naming its vhost
    (flat,) = [x for x in status["queues"] if x["name"] == q]
    assert flat == queue and flat["vhost"] == vhost["name"] == "/"
    nested = [(v["name"], x["name"]) for v in status["vhosts"] for x in v["queues"]]
    assert [(x["vhost"], x["name"]) for x in status["queues"]] == nested


def _queue_status(server: str, capsys: pytest.CaptureFixture[str], name: str) -> dict:
    code, out, _ = run(capsys, "status", "--json", "-s", server)
    assert code == 0
    (vhost,) = json.loads(out)["vhosts"]
    (queue,) = [x for x in vhost["queues"] if x["name"] == name]
    return dict(queue)


def test_declare_a_stream_queue(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = _name("stream")
    code, out, _ = run(
        capsys,
        "declare",
        "queue",
        q,
        "--type",
        "stream",
        "--max-age",
        "7D",
        "--max-length-bytes",
        "1000000",
        "-s",
        server,
    )
    assert (code, out) == (0, f"declared queue '{q}' (0 messages, 0 consumers)\n")
    queue = _queue_status(server, capsys, q)
    assert queue["type"] == "stream" and queue["durable"]  # a stream is always durable
    assert queue["arguments"] == {
        "x-queue-type": "stream",
        "x-max-age": "7D",
        "x-max-length-bytes": 1000000,
    }
    code, _, err = run(capsys, "declare", "queue", _name("s"), "--type", "stream",
                       "--max-age", "a week", "-s", server)  # fmt: skip
    assert code == 1 and "x-max-age" in err


def _stream_of_five(server: str, capsys: pytest.CaptureFixture[str]) -> str:
    q = _name("stream")
    assert run(capsys, "declare", "queue", q, "--type", "stream", "-s", server)[0] == 0
    code, _, err = run(
        capsys, "publish", "-s", server, "-k", q, "--confirm", "--count", "5", "e{n}"
    )
    assert (code, err) == (0, "published 5 confirmed 5\n")  # offsets 0-4
    return q


def test_consume_a_stream_from_an_offset(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = _stream_of_five(server, capsys)
    consume = ("consume", "-s", server, "-q", q)
    code, out, _ = run(capsys, *consume, "--offset", "first", "--count", "5")
    assert (code, out) == (0, "e1\ne2\ne3\ne4\ne5\n")
    code, out, _ = run(capsys, *consume, "--offset", "first", "--count", "2")
    assert (code, out) == (0, "e1\ne2\n")  # a stream keeps what was read and acked
    code, out, _ = run(capsys, *consume, "--offset", "3", "--json", "--timeout", "0.3")
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [(r["offset"], r["body"]) for r in records] == [(3, "e4"), (4, "e5")]
    code, out, _ = run(capsys, *consume, "--offset", "last", "--count", "1")
    assert (code, out) == (0, "e5\n")
    code, out, _ = run(capsys, *consume, "--offset", "2000-01-01T00:00:00Z", "--count", "1")
    assert (code, out) == (0, "e1\n")
    code, out, _ = run(capsys, *consume, "--offset", "2999-01-01T00:00:00", "--timeout", "0.3")
    assert (code, out) == (0, "")
    code, out, _ = run(capsys, *consume, "--offset", "next", "--timeout", "0.3")
    assert (code, out) == (0, "")


def test_consume_name_resumes_across_invocations(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = _stream_of_five(server, capsys)
    consume = ("consume", "-s", server, "-q", q, "--name", "reader")
    code, out, _ = run(capsys, *consume, "--count", "3")  # nothing stored: from first
    assert (code, out) == (0, "e1\ne2\ne3\n")
    code, out, _ = run(capsys, *consume, "--timeout", "0.3")
    assert (code, out) == (0, "e4\ne5\n")
    code, out, _ = run(capsys, *consume, "--timeout", "0.3")
    assert (code, out) == (0, "")
    assert run(capsys, "publish", "-s", server, "-k", q, "--confirm", "e6")[0] == 0
    code, out, _ = run(capsys, *consume, "--offset", "first", "--json", "--count", "1")
    assert code == 0 and json.loads(out)["offset"] == 5  # the stored offset wins
    # another name starts at --offset while nothing is stored under it
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--name", "other",
                       "--offset", "last", "--count", "1")  # fmt: skip
    assert (code, out) == (0, "e6\n")


def test_consume_name_stores_every_100_and_at_exit(
    server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from amqlite.client import Connection

    q = _name("stream")
    run(capsys, "declare", "queue", q, "--type", "stream", "-s", server)
    run(capsys, "publish", "-s", server, "-k", q, "--confirm", "--count", "250", "m{n}")
    stored: list[tuple[str, str, int]] = []
    store = Connection.store_offset

    async def spy(self: Connection, queue: str, name: str, offset: int) -> None:
        stored.append((queue, name, offset))
        await store(self, queue, name, offset)

    monkeypatch.setattr(Connection, "store_offset", spy)
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--name", "b", "--count", "150")
    assert code == 0 and len(out.splitlines()) == 150
    assert stored == [(q, "b", 99), (q, "b", 149)]
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--name", "b", "--timeout", "0.3")
    assert code == 0 and out.split() == [f"m{i}" for i in range(151, 251)]
    assert stored[2:] == [(q, "b", 249)]  # 100 more: one store, at 100; none at exit


def test_consume_name_stores_on_ctrl_c(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = _stream_of_five(server, capsys)
    child = subprocess.Popen(
        [sys.executable, "-m", "amqlite", "consume", "-s", server, "-q", q, "--name", "c"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(30, child.kill)
    watchdog.start()
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline() for _ in range(5)]  # flushed before it waits
        assert lines == [f"e{i}\n" for i in range(1, 6)]
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=20)
    finally:
        watchdog.cancel()
        if child.poll() is None:  # pragma: no cover
            child.kill()
            child.wait()
    assert child.returncode == 130, err
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--name", "c", "--timeout", "0.3")
    assert (code, out) == (0, "")  # offset 4 was stored on the way out


def test_status_tables(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = _name("shown")
    run(capsys, "declare", "queue", q, "-s", server)
    code, out, err = run(capsys, "status", "-s", server)
    assert code == 0 and err == ""
    assert "standalone" in out and q in out
    for title in ("queues", "exchanges", "connections"):
        assert title in out


def test_global_options_before_the_command(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "-s", server, "status", "--json")
    assert code == 0 and json.loads(out)["state"] == "standalone"


def test_servers_from_the_environment(
    server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMQLITE_SERVERS", server)
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0 and json.loads(out)["listen"] == server


def test_status_asks_every_listed_node(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = _name("listed")
    run(capsys, "declare", "queue", q, "-s", server)
    code, out, _ = run(capsys, "status", "--json", "-s", f"127.0.0.1:1,{server}")
    shown = json.loads(out)
    assert list(shown) == ["nodes"]  # several servers: {"nodes": [...]}, in the order given
    down, up = shown["nodes"]
    assert code == 0
    assert down == {"address": "127.0.0.1:1", "error": down["error"]} and down["error"]
    assert up["listen"] == server
    assert {"vhost": "/", "name": q}.items() <= next(
        x for x in up["queues"] if x["name"] == q
    ).items()
    # one server: the node's map itself, the same keys as a node under "nodes"
    code, out, _ = run(capsys, "status", "--json", "-s", server)
    alone = json.loads(out)
    assert code == 0 and "nodes" not in alone
    assert set(alone) == set(up) and alone["listen"] == server


def test_flat_queues_name_their_vhost_and_keep_the_nested_list() -> None:
    from amqlite.cli.status import with_flat_queues

    status = {
        "node_id": "n",
        "vhosts": [
            {"name": "/", "queues": [{"vhost": "/", "name": "a"}]},
            {"name": "shop", "queues": [{"name": "b"}, {"vhost": "shop", "name": "c"}]},
            {"name": "empty", "queues": []},
        ],
    }
    shown = with_flat_queues(status)
    assert shown["queues"] == [
        {"vhost": "/", "name": "a"},
        {"vhost": "shop", "name": "b"},
        {"vhost": "shop", "name": "c"},
    ]
    assert shown["vhosts"] == status["vhosts"] and "queues" not in status
    failed = {"address": "h:1", "error": "cannot connect"}
    assert with_flat_queues(failed) == failed


def test_rate_paces_publishing(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = _name("paced")
    run(capsys, "declare", "queue", q, "-s", server)
    start = time.monotonic()
    code, _, err = run(
        capsys,
        "publish",
        "-s",
        server,
        "-k",
        q,
        "--rate",
        "200",
        "--count",
        "20",
        "--confirm",
        "t{n}",
    )
    assert (code, err) == (0, "published 20 confirmed 20\n")
    assert time.monotonic() - start >= 19 / 200  # the 20th is not due before 95 ms


def test_cannot_connect_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = run(capsys, "status", "-s", f"127.0.0.1:{port}")
    assert (code, out) == (1, "")
    assert err == f"amqlite: error: cannot connect to 127.0.0.1:{port} (connection refused)\n"


def test_bad_login_is_one_line(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "status", "-s", server, "--password", "wrong")
    assert code == 1
    assert err.startswith(f"amqlite: error: {server} refused the connection: 403 ACCESS_REFUSED")
    assert err.count("\n") == 1


def test_passwd_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("s3cret\n"))
    code, out, err = run(capsys, "passwd", "--stdin")
    assert code == 0 and err == ""
    assert verify_password("s3cret", out.strip())
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    code, out, err = run(capsys, "passwd", "--stdin")
    assert (code, out, err) == (1, "", "amqlite: error: empty password\n")


def test_passwd_prints_a_users_entry_with_tags(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("s3cret\n"))
    code, out, err = run(capsys, "passwd", "--stdin", "--user", "ops", "--tags", "monitoring")
    assert code == 0 and err == ""
    path = tmp_path / "users.toml"
    path.write_text(out.replace('configure = ""', 'configure = ".*"'), encoding="utf-8")
    (user,) = load_config(path).users
    assert (user.name, user.tags) == ("ops", ("monitoring",))
    assert verify_password("s3cret", user.password_hash)
    assert user.permissions_for("/") is not None
    monkeypatch.setattr(sys, "stdin", io.StringIO("s3cret\n"))
    code, out, err = run(capsys, "passwd", "--stdin", "--user", "ops", "--tags", "admin")
    assert code == 1 and out == ""
    assert "unknown tag 'admin' (known: administrator, monitoring" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "COMMAND"),
        (["frobnicate"], "invalid choice"),
        (["publish"], "the following arguments are required: BODY"),
        (["publish", "--count", "0", "x"], "--count must be at least 1"),
        (["publish", "--count", "2", "-"], "--count does not apply to stdin"),
        (["publish", "-H", "novalue", "x"], "header 'novalue' must look like name=value"),
        (["publish", "-P", "colour=red", "x"], "unknown property 'colour'"),
        (["consume"], "one of the arguments -q/--queue -e/--exchange is required"),
        (["consume", "-q", "a", "-e", "b"], "not allowed with argument"),
        (["declare", "exchange", "x", "weird"], "invalid choice: 'weird'"),
        (["declare", "queue", "s", "--type", "stream", "--exclusive"], "cannot be --exclusive"),
        (["declare", "queue", "s", "--max-length-bytes", "-1"], "must not be negative"),
        (["consume", "-e", "x", "--offset", "first"], "go with -q/--queue"),
        (["consume", "-e", "x", "--name", "n"], "go with -q/--queue"),
        (["consume", "-q", "s", "--offset", "yesterday"], "--offset must be first, last"),
        (["consume", "-q", "s", "--offset", "-2"], "--offset must not be negative"),
        (["consume", "-q", "s", "--name", ""], "--name must not be empty"),
        (["status", "-s", "host:notaport"], "port must be a number"),
    ],
)
def test_bad_usage_exits_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err


def test_help_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["--help"],
        ["publish", "--help"],
        ["consume", "--help"],
        ["declare", "--help"],
        ["declare", "queue", "--help"],
        ["declare", "exchange", "--help"],
        ["bind", "--help"],
        ["status", "--help"],
        ["passwd", "--help"],
        ["server", "--help"],
        ["witness", "--help"],
        ["bench", "--help"],
    ):
        code, out, _ = run(capsys, *argv)
        assert code == 0, argv
        assert "usage: amqlite" in out
    assert "examples:" in run(capsys, "publish", "--help")[1]
    status_help = run(capsys, "status", "--help")[1]
    assert '{"nodes": [...]}' in status_help and "queues (every vhost's queues" in status_help
    assert "--data-dir" in run(capsys, "server", "--help")[1]
    witness_help = run(capsys, "witness", "--help")[1]
    assert "lease" in witness_help and "[cluster] witness" in witness_help
    assert "'cluster' tag" in witness_help and "--state" in witness_help
    code, out, _ = run(capsys, "--version")
    assert (code, out) == (0, "amqlite 0.1.0\n")


def test_bench_hands_over_to_the_harness(capsys: pytest.CaptureFixture[str]) -> None:
    # the tests put this checkout's benchmarks/ on sys.path (pyproject: pythonpath)
    code, out, _ = run(capsys, "bench", "--help")
    assert code == 0
    assert out.startswith("usage: amqlite bench ")
    assert "Measure amqlite against a raw-trio relay" in out and "--vs" in out
    code, _, err = run(capsys, "bench", "--scenarios", "nope")
    assert code == 2 and "--scenarios" in err


@pytest.mark.parametrize("argv", [["bench"], ["bench", "--help"], ["bench", "--quick"]])
def test_bench_without_the_harness_says_how_to_install_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.setitem(sys.modules, "amqlite_bench", None)  # import amqlite_bench fails
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith("amqlite: error: amqlite bench needs the benchmark harness")
    assert "pip install -e benchmarks/" in err and "scripts/bench" in err
    assert run(capsys, "--help")[0] == 0  # the other commands do not need it


def test_an_import_error_inside_the_harness_is_not_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    from amqlite.cli import delegated

    def broken(name: str) -> object:
        raise ModuleNotFoundError("No module named 'hdrh'", name="hdrh")

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="hdrh"):
        delegated.bench_harness()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42),
        ("-3", -3),
        ("1.5", 1.5),
        ("true", True),
        ("False", False),
        ("eu", "eu"),
        ("", ""),
    ],
)
def test_parse_scalar(text: str, value: object) -> None:
    assert parse_scalar(text) == value and type(parse_scalar(text)) is type(value)


def test_entry_point_module_runs(tmp_path: Path) -> None:
    result = run_process("--version")
    assert (result.returncode, result.stdout) == (0, "amqlite 0.1.0\n")


def test_consume_from_a_missing_queue_is_one_line(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "consume", "-s", server, "-q", "no-such-queue", "--count", "1")
    assert (code, out) == (1, "")
    assert err == "amqlite: error: 404 NOT_FOUND: no queue 'no-such-queue' in vhost '/'\n"


def test_publish_ctrl_c_exits_130_and_says_what_was_sent(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import signal as _signal
    import subprocess as _subprocess
    import sys as _sys

    q = _name("interrupted")
    assert run(capsys, "declare", "queue", q, "-s", server)[0] == 0
    proc = _subprocess.Popen(
        [_sys.executable, "-m", "amqlite", "publish", "-s", server, "-k", q, "--confirm",
         "--count", "100000", "--rate", "200", "m{n}"],
        stderr=_subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    try:

        def waiting() -> int:
            status = json.loads(run(capsys, "status", "--json", "-s", server)[1])
            queues = {x["name"]: x for v in status["vhosts"] for x in v["queues"]}
            return int(queues[q]["messages"])

        poll_until(waiting, "messages in the queue (it is publishing)", deadline=30, every=0.05)
        proc.send_signal(_signal.SIGINT)
        proc.wait(timeout=20)
        err = proc.stderr.read()
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.startswith("published "), err


def test_trace_on_records_into_amq_trace_and_off_stops(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = _name("traced")
    run(capsys, "declare", "queue", q, "-s", server)
    assert run(capsys, "trace", "on", "-s", server)[:2] == (0, "trace on (stream amq.trace)\n")
    try:
        run(capsys, "publish", "-s", server, "-k", q, "-P", "message_id=t1", "--confirm", "x")
    finally:
        assert run(capsys, "trace", "off", "-s", server)[:2] == (
            0,
            "trace off (stream amq.trace)\n",
        )
    run(capsys, "publish", "-s", server, "-k", q, "-P", "message_id=t2", "--confirm", "x")
    code, out, _ = run(
        capsys,
        "consume",
        "-s",
        server,
        "-q",
        "amq.trace",
        "--offset",
        "first",
        "--json",
        "--timeout",
        "0.5",
    )
    assert code == 0
    records = [json.loads(line)["headers"] for line in out.splitlines()]
    mine = [(r["event"], r["message_id"]) for r in records if r["queue"] == q]
    assert mine == [("publish", "t1")]  # t2 came after trace off


def test_status_tables_show_peering_links() -> None:
    import io

    from amqlite.cli.status import print_status

    link = {
        "link": "orders",
        "role": "dialer",
        "vhost": "/",
        "exchange": "orders",
        "mode": "publish",
        "state": "backoff",
        "remote_address": "127.0.0.1:6001",
        "remote_node": "site-b",
        "last_error": "127.0.0.1:6001: OSError: connection refused",
        "lag_seconds": 1.5,
        "lag_messages": 12,
        "in_flight": 3,
        "buffered_bytes": 4096,
        "forwarded": 77,
        "received": 0,
        "duplicates_dropped": 2,
        "loops_dropped": 1,
        "interest_size": 4,
    }
    out = io.StringIO()
    print_status({"node_id": "site-a", "vhosts": [], "links": [link]}, file=out)
    text = out.getvalue()
    assert "peering links" in text
    for shown in ("/:orders", "publish", "backoff", "127.0.0.1:6001", "site-b", "4096", "77"):
        assert shown in text, shown
    assert "last error: 127.0.0.1:6001: OSError: connection refused" in text
    subscriber = {
        **link,
        "role": "acceptor",
        "mode": "subscribe",
        "queue": "amq.peering.orders.site-b/orders",
        "queued": 9,
        "last_error": "",
    }
    out = io.StringIO()
    print_status({"node_id": "site-a", "vhosts": [], "links": [subscriber]}, file=out)
    assert "peering queue amq.peering.orders.site-b/orders: 9 waiting" in out.getvalue()
    out = io.StringIO()
    print_status({"node_id": "alone", "vhosts": [], "links": []}, file=out)
    assert "peering links" not in out.getvalue()


def test_status_tables_show_alarms_and_blocked_connections() -> None:
    import io

    from amqlite.cli.status import print_status

    conn = {"remote": "127.0.0.1:4000", "user": "app", "vhost": "/", "since_s": 3.0}
    status = {
        "node_id": "n",
        "vhosts": [],
        "alarms": ["memory"],
        "connections": [{**conn, "blocked": "low on memory"}],
    }
    out = io.StringIO()
    print_status(status, file=out)
    text = out.getvalue()
    assert "alarms memory: publishing connections are blocked" in text
    assert "low on memory" in text
    out = io.StringIO()
    print_status({**status, "alarms": [], "connections": [conn]}, file=out)
    assert "alarms" not in out.getvalue() and "low on memory" not in out.getvalue()


def test_status_tables_show_tls() -> None:
    import io

    from amqlite.cli.status import print_ha, print_status

    tls = {"native": True, "amqp": False, "verify": "mutual", "min_version": "1.3"}
    link = {"link": "x", "role": "dialer", "mode": "publish", "state": "up", "tls": True}
    out = io.StringIO()
    print_status({"node_id": "n", "vhosts": [], "tls": tls, "links": [link]}, file=out)
    text = out.getvalue()
    assert "tls native (verify mutual, min TLS 1.3)" in text
    assert "link x  tls" in text
    out = io.StringIO()
    print_ha({"ha": {"role": "primary", "link_up": True, "tls": True}}, file=out)
    assert "link up (tls)" in out.getvalue()
    out = io.StringIO()
    plain = {**tls, "native": False, "amqp": None}
    print_status({"node_id": "n", "vhosts": [], "tls": plain, "links": []}, file=out)
    print_ha({"ha": {"role": "primary", "link_up": True, "tls": False}}, file=out)
    assert "tls" not in out.getvalue()


def test_nothing_outside_the_command_line_imports_it() -> None:
    """The CLI sits on top: amqlite.spark and the rest never import amqlite.cli (what they
    share with it lives below, e.g. amqlite.connection_args); nothing in amqlite
    imports the bench harness (the CLI reaches it by name, in cli/delegated.py)."""
    import ast

    package = Path(__file__).resolve().parents[1] / "amqlite"
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent)
        inside_cli = rel.parts[1] == "cli" or rel.parts[1] == "__main__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against the module's package
                    parts = list(rel.with_suffix("").parts)[: -node.level]
                    base = ".".join([*parts, base] if base else parts)
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                if name.startswith("amqlite_bench") or (
                    not inside_cli and (name == "amqlite.cli" or name.startswith("amqlite.cli."))
                ):
                    found.append(f"{rel}:{node.lineno} imports {name}")
    assert found == []


def test_consume_with_a_selector(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = _name("selected")
    run(capsys, "declare", "queue", q, "-s", server)
    for region in ("eu", "us", "eu", "us"):
        code, _, _ = run(
            capsys, "publish", "-s", server, "-k", q, "-H", f"region={region}", "--confirm", region
        )
        assert code == 0
    code, out, _ = run(
        capsys, "consume", "-s", server, "-q", q, "--selector", "region = 'us'", "--timeout", "0.3"
    )
    assert (code, out) == (0, "us\nus\n")
    code, out, err = run(
        capsys, "consume", "-s", server, "-q", q, "--selector", "region = 'eu", "--count", "1"
    )
    assert code != 0
    assert out == ""
    assert "406" in err and "selector error at position 9: string not closed" in err
    code, out, _ = run(capsys, "consume", "-s", server, "-q", q, "--timeout", "0.3")
    assert (code, out) == (0, "eu\neu\n")  # left in the queue for others
