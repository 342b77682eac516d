"""The browser channels' sans-IO half: JSON frames <-> events, and the outbox."""

from __future__ import annotations

import json
from typing import Any

import pytest

from amqlite.browser import FrameError, Outbox, codec
from amqlite.protocol import events as ev

# --- decoding ---------------------------------------------------------------------


def test_a_publish_with_a_text_body_a_base64_body_headers_and_props() -> None:
    text = codec.decode_request(
        {"m": "publish", "id": 1, "exchange": "x", "key": "k", "body": "héllo",
         "headers": {"n": 1, "s": "t"}, "props": {"persistent": True}, "confirm": True}
    )  # fmt: skip
    assert text == ev.Publish(
        1, "x", "k", "héllo".encode(), {"n": 1, "s": "t"}, {"persistent": True}, False, True
    )
    binary = codec.decode_request({"m": "publish", "id": 2, "exchange": "", "key": "q",
                                   "body64": "AP8="})  # fmt: skip
    assert isinstance(binary, ev.Publish) and binary.body == b"\x00\xff"


@pytest.mark.parametrize(
    ("value", "rid", "code", "words"),
    [
        ([1, 2], None, 501, "JSON object"),
        ({"m": "consume", "queue": "q"}, None, 502, "integer 'id'"),
        ({"id": 3}, 3, 502, "method"),
        ({"m": "frobnicate", "id": 4}, 4, 540, "unknown method"),
        ({"m": "hello", "id": 5}, 5, 540, "unknown method"),  # the channel's own
        ({"m": "ha.sync", "id": 6}, 6, 540, "unknown method"),  # not a client's
        ({"m": "publish", "id": 7, "exchange": "", "key": "k"}, 7, 502, "body"),
        ({"m": "publish", "id": 8, "exchange": "", "key": "k", "body64": "!!"}, 8, 502, "base64"),
        ({"m": "publish", "id": 9, "exchange": 1, "key": "k", "body": ""}, 9, 502, "exchange"),
        (
            {
                "m": "publish",
                "id": 10,
                "exchange": "",
                "key": "k",
                "body": "",
                "headers": {"h": [1]},
            },
            10,
            502,
            "headers",
        ),
        ({"m": "consume", "id": 11, "queue": "q", "prefetch": "x"}, 11, 502, "prefetch"),
        ({"m": "ack", "id": 12}, 12, 502, "dtag"),
    ],
)
def test_frames_that_cannot_run_carry_their_error(
    value: Any, rid: int | None, code: int, words: str
) -> None:
    with pytest.raises(FrameError) as info:
        codec.decode_request(value)
    assert (info.value.rid, info.value.code) == (rid, code)
    assert words in info.value.text
    reply = json.loads(info.value.reply)
    assert reply["m"] == "error" and reply["code"] == code and reply.get("re") == rid


def test_not_json_is_a_syntax_error() -> None:
    with pytest.raises(FrameError) as info:
        codec.parse("{nope")
    assert info.value.code == 502 and info.value.rid is None


# --- encoding ---------------------------------------------------------------------


def test_replies_and_deliveries_as_json() -> None:
    assert json.loads(codec.encode(ev.Ok(3, {"tag": "ctag-1"}))) == {
        "m": "ok", "re": 3, "info": {"tag": "ctag-1"}
    }  # fmt: skip
    assert json.loads(codec.encode(ev.Error(None, 502, "bad"))) == {
        "m": "error", "re": None, "code": 502, "text": "bad"
    }  # fmt: skip
    got = json.loads(codec.encode(ev.GetOk(4, 1, "x", "k", b"\xff")))
    assert got["body64"] == "/w==" and "body" not in got
    text = json.loads(codec.deliver_frame("c", 7, True, "x", "k", "hé".encode(), {"b": b"\xff"},
                                          {"priority": 1}, "q"))  # fmt: skip
    assert text == {
        "m": "deliver", "ctag": "c", "dtag": 7, "exchange": "x", "key": "k", "body": "hé",
        "headers": {"b": "/w=="}, "props": {"priority": 1}, "redelivered": True, "queue": "q",
    }  # fmt: skip


# --- the outbox -------------------------------------------------------------------


def test_poll_frames_stay_until_acknowledged() -> None:
    box = Outbox(high=1000, low=500)
    seqs = [box.add(f'"{n}"') for n in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    assert [s for s, _ in box.after(0, 1000)] == [1, 2, 3, 4, 5]
    assert [s for s, _ in box.after(0, 6)] == [1, 2]  # about the limit
    assert [s for s, _ in box.after(0, 1)] == [1]  # at least one
    box.ack(3)
    assert [s for s, _ in box.after(0, 1000)] == [4, 5] and len(box) == 2
    assert box.after(5, 1000) == []
    box.ack(99)  # more than was sent: all of it
    assert len(box) == 0 and box.bytes == 0 and box.acked == 5


def test_ws_take_forgets() -> None:
    box = Outbox(high=1000, low=500)
    for _n in range(4):
        box.add("x" * 10)
    assert len(box.take(25)) == 2 and len(box) == 2 and box.acked == 2
    assert len(box.take(1)) == 1
    assert box.bytes == 10


def test_past_high_the_oldest_droppable_frames_go_with_one_notice_per_consumer() -> None:
    box = Outbox(high=1000, low=400)
    box.add("r" * 100)  # a reply: never dropped
    box.add("k" * 100, droppable=False, ctag="A")  # an acked delivery: kept
    for n in range(4):
        box.add(f"a{n}" * 50, droppable=True, ctag="A")
        box.add(f"b{n}" * 50, droppable=True, ctag="B")
    assert box.dropped_total == 0 and box.bytes == 1000
    box.add("c" * 100, droppable=True, ctag="C")  # 1100 > 1000: drop down to 400
    texts = [t for _, t in box.after(0, 100_000)]
    notices = [json.loads(t) for t in texts if t.startswith("{")]
    frames = [t for t in texts if not t.startswith("{")]
    # the oldest went first: 7 droppable frames, the 700 bytes over low
    assert frames == ["r" * 100, "k" * 100, "b3" * 50, "c" * 100]
    assert {(n["m"], n["ctag"], n["count"]) for n in notices} == {
        ("dropped", "A", 4), ("dropped", "B", 3)
    }  # fmt: skip
    assert box.dropped_total == 7 and notices[-1]["total"] == 7
    assert texts[-2:] == [t for t in texts if t.startswith("{")]  # the notices come last
    assert not box.over


def test_full_of_frames_that_must_not_go_says_over_until_drained() -> None:
    box = Outbox(high=50, low=20)
    for _ in range(6):
        box.add("k" * 10)
    assert box.over and not box.resumable and box.dropped_total == 0
    box.take(30)
    assert not box.over and not box.resumable
    box.take(10)
    assert box.resumable


def test_bad_bounds() -> None:
    with pytest.raises(ValueError):
        Outbox(high=1, low=2)
