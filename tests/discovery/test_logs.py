"""Every line a lorafleet process logs is structured, its libraries' lines too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import logging, structlog
    from discovery.logs import configure_logging
    configure_logging(process="frontend")
    structlog.get_logger("lorafleet").warning("worker gone", worker="w1")
    logging.getLogger("uvicorn.error").error("Application startup failed. Exiting.")
    logging.getLogger("nats").info("below the threshold of library loggers")
""")


def test_json_logs_give_one_object_per_line_for_our_and_library_loggers():
    env = {**os.environ, "LOG_FORMAT": "json"}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, check=True
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(line["level"], line["event"]) for line in lines] == [
        ("warning", "worker gone"),
        ("error", "Application startup failed. Exiting."),
    ]
    assert all(line["process"] == "frontend" and "timestamp" in line for line in lines)
    assert lines[0]["worker"] == "w1"
    assert lines[1]["logger"] == "uvicorn.error"
