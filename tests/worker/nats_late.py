"""Scenario: a worker starts while NATS is down, waits, and serves once NATS comes up.

Written once; ``tests/worker/test_runtime.py`` runs it with NATS down for seconds and
``tests/chaos/test_worker_start.py`` for the two minutes that once printed 1,099 lines.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Final

from lorafleet.launch.local_servers import free_port, start_nats
from tests.processes import start_worker

MAX_LINES_BEFORE_READY: Final = 6
"""Start-up lines however long the wait: the connect attempts are logged once."""


def worker_waits_for_late_nats(tmp_path: Path, etcd_url: str, *, down_s: float) -> None:
    """NATS comes up ``down_s`` after the worker: the worker gets ready, and its log holds
    only JSON lines, a handful of them, however many attempts it made meanwhile."""
    port = free_port()
    worker = start_worker(
        tmp_path, etcd_url=etcd_url, nats_url=f"nats://127.0.0.1:{port}", namespace="late",
        env={"LOG_FORMAT": "json", "DYN_CONNECT_TIMEOUT_S": str(down_s + 60)}, wait=False,
    )  # fmt: skip
    try:
        worker.wait_for_log("waiting for NATS")
        time.sleep(down_s)  # the outage itself, not a wait for an event
        nats = start_nats(tmp_path / "nats", port=port)
        try:
            worker.wait_ready()
            lines = [json.loads(line) for line in worker.log_path.read_text().splitlines()]
            events = [line["event"] for line in lines]
            assert events.count("waiting for NATS") == 1 and "NATS reachable" in events
            assert events.index("worker ready") < MAX_LINES_BEFORE_READY, events
            assert worker.terminate() == 0
        finally:
            nats.stop()
    finally:
        worker.kill()
