"""structlog set-up: JSON lines that parse, console lines for people, levels, reconfiguration."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import structlog

from amqlite.errors import ConfigError
from amqlite.log import configure_logging, get_logger


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def json_lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_event_level_timestamp_and_context() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream)

    get_logger("amqlite.server").info("connection_opened", remote="127.0.0.1:5123", user="guest")

    (line,) = json_lines(stream)
    assert line["event"] == "connection_opened"
    assert line["level"] == "info"
    assert line["logger"] == "amqlite.server"
    assert line["remote"] == "127.0.0.1:5123"
    assert line["user"] == "guest"
    timestamp = str(line["timestamp"])
    assert timestamp.endswith("Z")
    assert datetime.fromisoformat(timestamp.replace("Z", "+00:00")).tzinfo is not None


def test_json_handles_values_json_cannot_encode() -> None:
    stream = io.StringIO()
    configure_logging("json", stream=stream)

    get_logger("t").warning("odd_value", value={1, 2}, raw=b"\x00")

    (line,) = json_lines(stream)
    assert line["level"] == "warning"
    assert isinstance(line["value"], str)


def test_json_exception_is_structured() -> None:
    stream = io.StringIO()
    configure_logging("json", stream=stream)

    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger("t").exception("task_crashed", task="accept")

    (line,) = json_lines(stream)
    assert line["level"] == "error"
    assert line["task"] == "accept"
    assert "boom" in json.dumps(line["exception"])


@pytest.mark.parametrize(
    ("level", "emitted"),
    [
        ("debug", ["d", "i", "w", "e"]),
        ("info", ["i", "w", "e"]),
        ("warning", ["w", "e"]),
        ("error", ["e"]),
    ],
)
def test_level_filters_less_severe_events(level: str, emitted: list[str]) -> None:
    stream = io.StringIO()
    configure_logging("json", level, stream)
    log = get_logger("t")

    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")

    assert [line["event"] for line in json_lines(stream)] == emitted


def test_console_output_is_plain_text_off_a_terminal() -> None:
    stream = io.StringIO()
    configure_logging("console", "info", stream)

    get_logger("amqlite.server").info("connection_opened", remote="127.0.0.1:5123")

    text = stream.getvalue()
    assert "connection_opened" in text
    assert "remote=127.0.0.1:5123" in text
    assert "info" in text
    assert "\x1b[" not in text
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", text)


def test_console_output_has_colours_on_a_terminal() -> None:
    stream = FakeTerminal()
    configure_logging("console", "info", stream)

    get_logger("t").info("hello", who="world")

    assert "\x1b[" in stream.getvalue()


def test_reconfiguring_applies_to_loggers_created_earlier() -> None:
    early = get_logger("early")
    first, second = io.StringIO(), io.StringIO()

    configure_logging("console", "info", first)
    early.info("one")
    configure_logging("json", "info", second)
    early.info("two")

    assert "one" in first.getvalue()
    assert "two" not in first.getvalue()
    assert [line["event"] for line in json_lines(second)] == ["two"]


def test_contextvars_are_merged() -> None:
    stream = io.StringIO()
    configure_logging("json", stream=stream)
    structlog.contextvars.bind_contextvars(conn_id=7)

    get_logger("t").info("frame_received")

    assert json_lines(stream)[0]["conn_id"] == 7


def test_default_stream_is_the_current_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")

    get_logger("t").info("to_stderr")

    captured = capsys.readouterr()
    assert captured.out == ""
    assert json.loads(captured.err)["event"] == "to_stderr"


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [({"format": "xml"}, "log.format"), ({"level": "trace"}, "log.level")],
)
def test_bad_format_or_level_is_a_config_error(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        configure_logging(**kwargs)
    assert caught.value.key == key
