"""structlog set-up for the shells (the sans-IO core never logs).

Events are snake_case names with key-value context::

    log = get_logger(__name__)
    log.info("connection_opened", peer="127.0.0.1:5123", user="guest")

Every line carries ``timestamp`` (ISO 8601, UTC), ``level``, ``event`` and
``logger``, plus whatever is bound with ``structlog.contextvars`` in the current
trio task. ``console`` output is for people (colours only on a terminal),
``json`` output is one JSON object per line for machines.

Loggers from :func:`get_logger` are lazy: they read the configuration at each
call, so module-level loggers created before :func:`configure_logging` obey it,
and calling :func:`configure_logging` again (tests do) takes effect at once.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO, cast

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor

from amqlite.errors import ConfigError

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "configure_logging", "get_logger"]

LOG_FORMATS: tuple[str, ...] = ("console", "json")
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")

_LEVEL_NUMBERS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(
    format: str = "console", level: str = "info", stream: TextIO | None = None
) -> None:
    """Send log events at ``level`` and above to ``stream`` (default: sys.stderr).

    Replaces any previous configuration, so it is safe to call more than once.
    Raises :class:`~amqlite.errors.ConfigError` naming ``log.format`` or
    ``log.level`` for values outside :data:`LOG_FORMATS` / :data:`LOG_LEVELS`.
    Tracebacks never include local variables (they may hold passwords).
    """
    if format not in LOG_FORMATS:
        raise ConfigError("log.format", f"must be one of {_choices(LOG_FORMATS)}, got {format!r}")
    if level not in _LEVEL_NUMBERS:
        raise ConfigError("log.level", f"must be one of {_choices(LOG_LEVELS)}, got {level!r}")
    out = sys.stderr if stream is None else stream
    processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        _add_logger_name,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if format == "json":
        processors += [structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer()]
    else:
        processors.append(_console_renderer(out))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVEL_NUMBERS[level]),
        context_class=dict,
        logger_factory=_NamedPrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> FilteringBoundLogger:
    """A logger whose events carry ``logger=name``; usually ``get_logger(__name__)``."""
    return cast(FilteringBoundLogger, structlog.get_logger(name))


class _NamedPrintLogger(structlog.PrintLogger):
    """A PrintLogger that remembers the name given to :func:`get_logger`."""

    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name


class _NamedPrintLoggerFactory:
    """structlog passes ``get_logger``'s positional arguments (the name) to this."""

    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, name: str = "", *_: Any) -> _NamedPrintLogger:
        return _NamedPrintLogger(self._file, name)


def _add_logger_name(logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
    name = getattr(logger, "name", "")
    if name:
        event_dict.setdefault("logger", name)
    return event_dict


def _console_renderer(out: TextIO) -> structlog.dev.ConsoleRenderer:
    is_tty = _is_tty(out)
    formatter = (
        structlog.dev.RichTracebackFormatter(show_locals=False)
        if is_tty
        else structlog.dev.plain_traceback
    )
    return structlog.dev.ConsoleRenderer(colors=is_tty, exception_formatter=formatter)


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):
        return False


def _choices(options: tuple[str, ...]) -> str:
    return ", ".join(repr(option) for option in options)
