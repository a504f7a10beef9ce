"""Every line a lorafleet process logs is structured, its libraries' lines too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime

import structlog

from lorafleet.process.logs import console_renderer

PROGRAM = textwrap.dedent("""
    import logging, structlog
    from lorafleet.process.logs import configure_logging
    configure_logging(process="frontend")
    structlog.get_logger("lorafleet").warning("worker gone", worker="w1")
    logging.getLogger("uvicorn.error").error("Application startup failed. Exiting.")
    logging.getLogger("nats").info("below the threshold of library loggers")
""")


def test_json_logs_give_one_object_per_line_for_our_and_library_loggers():
    env = {**os.environ, "LOG_FORMAT": "json"}
    started = datetime.now(UTC)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, check=True
    )
    ended = datetime.now(UTC)
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    for line in lines:  # ISO 8601 in UTC, to the microsecond (none when it is 0)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z", line["timestamp"])
        assert started <= datetime.fromisoformat(line["timestamp"]) <= ended
    assert [(line["level"], line["event"]) for line in lines] == [
        ("warning", "worker gone"),
        ("error", "Application startup failed. Exiting."),
    ]
    assert all(line["process"] == "frontend" and "timestamp" in line for line in lines)
    assert lines[0]["worker"] == "w1"
    assert lines[1]["logger"] == "uvicorn.error"


STRAY = textwrap.dedent("""
    import gc, threading, warnings
    from lorafleet.process.logs import configure_logging
    configure_logging(process="worker")

    class Leaky:
        def __del__(self):
            raise RuntimeError("failed in __del__")

    Leaky()
    gc.collect()
    warnings.warn("a library warns", DeprecationWarning, stacklevel=1)
    thread = threading.Thread(target=lambda: 1 / 0, name="helper")
    thread.start()
    thread.join()
    raise SystemError("nobody caught this")
""")


def test_json_logs_turn_warnings_and_uncaught_exceptions_into_one_line_each():
    env = {**os.environ, "LOG_FORMAT": "json", "PYTHONWARNINGS": "always"}
    done = subprocess.run([sys.executable, "-c", STRAY], env=env, capture_output=True, text=True)
    assert done.returncode == 1
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    assert len(lines) == 4
    assert "failed in __del__" in lines[0]["exception"]
    assert "a library warns" in lines[1]["event"] and lines[1]["logger"] == "py.warnings"
    assert lines[2]["event"] == "uncaught exception in thread" and lines[2]["thread"] == "helper"
    assert "ZeroDivisionError" in lines[2]["exception"]
    assert lines[3]["event"] == "uncaught exception"
    assert "nobody caught this" in lines[3]["exception"]


def test_console_renderer_writes_exactly_what_structlogs_own_writes():
    events = [
        {
            "event": "access",
            "method": "POST",
            "route": "/v1/chat/completions",
            "model": "demo",
            "status": 200,
            "duration_s": 0.0123,
            "prompt_tokens": 1,
            "completion_tokens": 4,
            "timestamp": "2026-11-30T21:00:00.000000Z",
            "level": "info",
            "process": "frontend",
            "request_id": "abc",
        },
        {
            "event": "x",
            "level": "warning",
            "logger": "uvicorn.error",
            "text": "a b=c 'q'",
            "none": None,
            "items": [1, "two"],
            "timestamp": "t",
        },
        {"event": "a longer event than the thirty characters it is padded to", "level": "error"},
        {"event": "no level", "unicode": "héllo wörld"},
        {"event": "quotes", "tab": "a\tb", "dq": 'say "hi"', "nl": "a\nb", "cr": "a\rb"},
        {"event": "plain", "path": "/v1/models/org/x", "empty": "", "number": 1.5, "flag": True},
    ]
    for colors in (False, True):
        ours = console_renderer(colors)
        stock = structlog.dev.ConsoleRenderer(colors=colors)
        for event in events:
            assert ours(None, "info", dict(event)) == stock(None, "info", dict(event))
