"""Structured logging for every lorafleet process (structlog to stderr).

``LOG_FORMAT=json`` gives one JSON object per line for log collectors; anything
else a readable console format. ``LOG_LEVEL`` sets the threshold. Libraries'
lines (nats-py, uvicorn, asyncio, grpc's Python side), warnings, and exceptions
nobody caught (main thread, other threads, ``__del__``) take the same path, so a
traceback is a field of one line, never lines of its own.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final

import structlog
from structlog.dev import Column, ColumnFormatter, KeyValueColumnFormatter
from structlog.typing import EventDict

__all__ = ["configure_logging", "console_renderer"]

_SECOND: Final = "%Y-%m-%dT%H:%M:%S"
_NEEDS_REPR: Final = re.compile("[ \t=\r\n\"']")


def configure_logging(*, process: str, level: str | None = None, fmt: str | None = None) -> None:
    """Route structlog and stdlib logging (uvicorn, nats, asyncio) to stderr, one format,
    every line tagged with ``process``."""
    level_name = (level or os.environ.get("LOG_LEVEL", "info")).upper()
    threshold = logging.getLevelNamesMapping().get(level_name, logging.INFO)
    as_json = (fmt or os.environ.get("LOG_FORMAT", "console")).lower() == "json"
    renderer = (
        structlog.processors.JSONRenderer() if as_json else console_renderer(sys.stderr.isatty())
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _IsoUtcTimestamp(),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        # PrintLogger's text in one write instead of print's two; flushed each line as well
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(process=process)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    logging.basicConfig(handlers=[handler], level=max(threshold, logging.WARNING), force=True)
    _route_stray_output()


class _IsoUtcTimestamp:
    """``TimeStamper(fmt="iso", utc=True)``'s text (``2026-12-01T04:05:06.123456Z``), its
    date and time to the second formatted once a second instead of once a line."""

    def __init__(self) -> None:
        self._second: tuple[int, str] = (-1, "")

    def __call__(self, _logger: object, _name: str, event_dict: EventDict) -> EventDict:
        second, nanos = divmod(time.time_ns(), 1_000_000_000)
        cached = self._second  # one read: another thread may replace it meanwhile
        if cached[0] != second:
            text = datetime.datetime.fromtimestamp(second, datetime.UTC).strftime(_SECOND)
            cached = self._second = (second, text)
        micros = nanos // 1000
        event_dict["timestamp"] = f"{cached[1]}.{micros:06d}Z" if micros else f"{cached[1]}Z"
        return event_dict


def console_renderer(colors: bool) -> structlog.dev.ConsoleRenderer:
    """structlog's console renderer, its ``key=value`` columns built without a ``StringIO``:
    the same text for a third of their CPU (the frontend renders ten per request)."""
    renderer = structlog.dev.ConsoleRenderer(colors=colors)
    quick = functools.partial(_quick, stock_repr=renderer._repr, native=renderer.repr_native_str)
    renderer.columns = [Column(c.key, quick(c.formatter)) for c in renderer.columns]
    return renderer


def _quick(
    formatter: ColumnFormatter, *, stock_repr: Callable[[Any], str], native: bool
) -> ColumnFormatter:
    """What ``KeyValueColumnFormatter.__call__`` writes, as one f-string (others as they are);
    ``stock_repr`` (the renderer's value repr) becomes ``_value_text`` unless ``native``."""
    if type(formatter) is not KeyValueColumnFormatter:
        return formatter
    f = formatter
    prefix = f.prefix + f.reset_style if f.prefix else ""
    postfix = f.postfix + f.reset_style if f.postfix else ""
    key_style, reset, value_style, width = f.key_style, f.reset_style, f.value_style, f.width
    value_repr = _value_text if f.value_repr == stock_repr and not native else f.value_repr
    if (prefix, postfix, key_style, reset, value_style, width) == ("", "", "", "", "", 0):

        def plain(key: str, value: object) -> str:  # without colors, most columns
            return f"{key}={value_repr(value)}"

        return plain

    def render(key: str, value: object) -> str:
        text = value_repr(value).ljust(width)
        if key_style is None:
            return f"{prefix}{value_style}{text}{reset}{postfix}"
        return f"{prefix}{key_style}{key}{reset}={value_style}{text}{reset}{postfix}"

    return render


def _value_text(value: object) -> str:
    """``ConsoleRenderer._repr``'s text, a regex search where it builds a set of characters:
    a string as it is unless a space, tab, ``=``, line break or quote asks for its repr."""
    if isinstance(value, str) and _NEEDS_REPR.search(value) is None:
        return value
    return repr(value)


def _route_stray_output() -> None:
    """Send warnings and uncaught exceptions through logging instead of raw stderr."""
    logging.captureWarnings(True)
    log = structlog.get_logger("lorafleet.uncaught")

    def on_uncaught(
        kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        log.critical("uncaught exception", exc_info=(kind, exc, tb))

    def on_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None:
            exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
            log.error("uncaught exception in thread", thread=getattr(args.thread, "name", None),
                      exc_info=exc_info)  # fmt: skip

    def on_unraisable(args: sys.UnraisableHookArgs) -> None:
        exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
        log.error(args.err_msg or "exception ignored", object=repr(args.object)[:200],
                  exc_info=exc_info if args.exc_value is not None else None)  # fmt: skip

    sys.excepthook = on_uncaught
    threading.excepthook = on_thread
    sys.unraisablehook = on_unraisable
