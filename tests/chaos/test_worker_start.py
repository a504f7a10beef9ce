"""Long version: a worker started while NATS is down for two minutes (issue 13, item 7)."""

from __future__ import annotations

from tests.worker.nats_late import worker_waits_for_late_nats


def test_worker_waits_two_minutes_for_nats_in_a_few_json_lines(tmp_path, etcd_url):
    worker_waits_for_late_nats(tmp_path, etcd_url, down_s=120)
