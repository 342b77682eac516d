"""``amqlite witness`` in process: login (the ``cluster`` tag), lease answers, and
the state file that a restarted witness starts from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from amqlite.auth import Authenticator, hash_password
from amqlite.config import UserConfig
from amqlite.ha.witness import FrameReader, LeaseAnswer, LeaseRequest, encode_frame, hello_map
from amqlite.server.witness import WitnessService


class Node:
    """A node's side of the witness link, by hand."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = FrameReader()

    async def next(self) -> dict[Any, Any]:
        while (data := self.reader.next_map()) is None:
            chunk = await self.stream.receive_some(4096)
            if not chunk:
                raise EOFError
            self.reader.feed(chunk)
        return data

    async def hello(self, login: str, password: str, node: str) -> dict[Any, Any]:
        await self.stream.send_all(encode_frame(hello_map(login, password, node)))
        return await self.next()

    async def ask(self, req: LeaseRequest) -> LeaseAnswer:
        await self.stream.send_all(encode_frame(req.to_map()))
        return LeaseAnswer.from_map(await self.next())


async def _serve(nursery: trio.Nursery, state: Path, auth: Authenticator) -> int:
    service = WitnessService(str(state), auth)
    port: int = await nursery.start(service.serve, "127.0.0.1", 0)
    return port


async def _node(port: int) -> Node:
    return Node(await trio.open_tcp_stream("127.0.0.1", port))


GUEST_ONLY = Authenticator([], ["/"])


async def test_a_lease_is_granted_refused_and_kept_in_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "witness.json"
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await _serve(nursery, state, GUEST_ONLY)
            p, b = await _node(port), await _node(port)
            assert (await p.hello("guest", "guest", "p"))["m"] == "welcome"
            assert (await b.hello("guest", "guest", "b"))["m"] == "welcome"
            granted = await p.ask(LeaseRequest(1, "p", 1, 5.0, True))
            assert (granted.granted, granted.holder, granted.epoch, granted.stale) == (
                True, "p", 1, True,
            )  # fmt: skip
            # the file holds the grant before the answer went out
            saved = json.loads(state.read_text())
            assert saved == {"holder": "p", "epoch": 1, "stale": True, "ttl": 5.0}
            refused = await b.ask(LeaseRequest(1, "b", 2, 5.0, False))
            assert (refused.granted, refused.holder, refused.epoch) == (False, "p", 1)
            nursery.cancel_scope.cancel()
        # a restarted witness starts from the file: the lease counts as held a ttl more
        async with trio.open_nursery() as nursery:
            port = await _serve(nursery, state, GUEST_ONLY)
            b = await _node(port)
            await b.hello("guest", "guest", "b")
            again = await b.ask(LeaseRequest(2, "b", 2, 5.0, False))
            assert (again.granted, again.holder, again.stale) == (False, "p", True)
            p = await _node(port)
            await p.hello("guest", "guest", "p")
            assert (await p.ask(LeaseRequest(3, "p", 1, 5.0, False))).granted  # in sync again
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("login", "password", "words"),
    [
        ("monitor", "secret", "needs the 'cluster' tag"),
        ("peer", "wrong", "access refused"),
    ],
)
async def test_only_a_cluster_user_logs_in(
    tmp_path: Path, login: str, password: str, words: str
) -> None:
    users = [
        UserConfig("peer", hash_password("secret", n=2**4), (), ("cluster",)),
        UserConfig("monitor", hash_password("secret", n=2**4), (), ("monitoring",)),
    ]
    auth = Authenticator(users, ["/"])
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await _serve(nursery, tmp_path / "w.json", auth)
            ok = await _node(port)
            assert (await ok.hello("peer", "secret", "p"))["m"] == "welcome"
            node = await _node(port)
            answer = await node.hello(login, password, "b")
            assert answer["m"] == "refused" and answer["code"] == 403
            assert words in answer["text"]
            nursery.cancel_scope.cancel()


async def test_a_bad_frame_gets_an_error_and_the_link_closes(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await _serve(nursery, tmp_path / "w.json", GUEST_ONLY)
            node = await _node(port)
            await node.hello("guest", "guest", "p")
            await node.stream.send_all(encode_frame({"m": "lease", "id": 1}))
            error = await node.next()
            assert error["m"] == "error" and "'ttl_ms'" in error["text"]
            with pytest.raises(EOFError):
                await node.next()
            nursery.cancel_scope.cancel()


def test_a_damaged_state_file_is_named(tmp_path: Path) -> None:
    from amqlite.server.witness import WitnessState

    path = tmp_path / "w.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="damaged"):
        WitnessState(str(path)).load()
