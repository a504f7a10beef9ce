"""Structured logging for every lorafleet process (structlog to stderr).

``LOG_FORMAT=json`` gives one JSON object per line for log collectors; anything
else a readable console format. ``LOG_LEVEL`` sets the threshold. It lives in
``discovery`` because both the worker and the frontend need it and neither may
import the other.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

__all__ = ["configure_logging"]


def configure_logging(*, process: str, level: str | None = None, fmt: str | None = None) -> None:
    """Route structlog and stdlib logging (uvicorn, nats, asyncio) to stderr, one format,
    every line tagged with ``process``."""
    level_name = (level or os.environ.get("LOG_LEVEL", "info")).upper()
    threshold = logging.getLevelNamesMapping().get(level_name, logging.INFO)
    as_json = (fmt or os.environ.get("LOG_FORMAT", "console")).lower() == "json"
    renderer = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
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
