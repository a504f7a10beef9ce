"""Stream migration end to end: a stream whose worker dies mid-answer continues on another.

Real ``python -m lorafleet.frontend`` and ``python -m lorafleet.worker`` mocker processes on real
etcd and NATS, the official ``openai`` client (no retries). The mocker's tokens
are numbered (``mig:0 mig:1 ...``), so a stream that skipped, repeated or
restarted a token would show in its text.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.processes import ServiceProcess, start_frontend, start_worker

pytestmark = pytest.mark.slow

PROMPT = "tell me a story"  # 4 words: the mocker counts whitespace-split words
TIME_PER_TOKEN_S = "0.05"
FAST_TIME_PER_TOKEN_S = "0.002"
WAIT_S = 15.0


class Fleet:
    """Mocker workers of one model and a frontend, in a namespace of one test."""

    def __init__(self, log_dir: Path, etcd_url: str, nats_url: str, namespace: str) -> None:
        self.log_dir, self.etcd_url, self.nats_url = log_dir, etcd_url, nats_url
        self.namespace = namespace
        self.workers: list[ServiceProcess] = []
        self.frontend: ServiceProcess | None = None

    def start(self, workers: int, frontend_env: dict[str, str] | None = None) -> Fleet:
        self.workers = [self._worker() for _ in range(workers)]
        self.frontend = start_frontend(
            self.log_dir, etcd_url=self.etcd_url, nats_url=self.nats_url,
            namespace=self.namespace, args=("--stall-timeout-s", "0.5"), env=frontend_env,
        )  # fmt: skip
        for worker in self.workers:
            worker.wait_ready()
        self._until(lambda: self.health()["instances"] == workers, "every worker is served")
        return self

    def add_worker(self, time_per_token_s: str = TIME_PER_TOKEN_S) -> None:
        """Start one more worker and wait until the frontend routes to it."""
        self.workers.append(self._worker(time_per_token_s))
        self.workers[-1].wait_ready()
        want = len(self.workers)
        self._until(lambda: self.health()["instances"] == want, "the new worker is served")

    def _worker(self, time_per_token_s: str = TIME_PER_TOKEN_S) -> ServiceProcess:
        return start_worker(
            self.log_dir, etcd_url=self.etcd_url, nats_url=self.nats_url,
            namespace=self.namespace, model="mig", wait=False,
            args=("--engine", "mocker", "--mocker-time-per-token-s", time_per_token_s,
                  "--engine-option", "output_tokens=1000"),
        )  # fmt: skip

    def stop(self) -> None:
        for process in [*self.workers, self.frontend]:
            if process is not None:
                process.kill()

    @property
    def url(self) -> str:
        assert self.frontend is not None
        return self.frontend.url

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health").json()

    def stream(self, max_tokens: int) -> openai.Stream:
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)
        return client.chat.completions.create(
            model="mig", messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens,
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip

    def kill_the_serving_worker(self) -> None:
        """SIGKILL the worker that has the (only) request in flight."""
        serving: list[ServiceProcess] = []

        def found() -> bool:
            serving[:] = [w for w in self.workers if w.process.poll() is None and _busy(w)]
            return len(serving) == 1

        self._until(found, "one worker serves the stream")
        serving[0].kill()

    def migrations(self) -> float:
        text = httpx.get(f"{self.url}/metrics").text
        found = re.search(r'lorafleet_frontend_stream_migrations_total{model="mig"} (\S+)', text)
        return float(found.group(1)) if found else 0.0

    @staticmethod
    def _until(condition, what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting until {what}"
            time.sleep(0.01)


def _busy(worker: ServiceProcess) -> bool:
    text = httpx.get(f"{worker.url}/metrics").text
    return "lorafleet_worker_inflight_requests 1.0" in text


def _expected(count: int, start: int = 0) -> str:
    return "".join(f"mig:{index} " for index in range(start, count))


@pytest.fixture
def fleet(tmp_path: Path, etcd_url: str, nats_url: str, namespace: str) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path, etcd_url, nats_url, namespace)
    try:
        yield fleet
    finally:
        fleet.stop()


def test_a_stream_whose_worker_is_killed_continues_on_the_other(fleet: Fleet) -> None:
    fleet.start(workers=2)
    pieces: list[str] = []
    finish, usage = None, None
    # 10 s of tokens: on a loaded machine the client may read far behind the worker, and
    # a stream the worker already finished cannot be cut by the kill.
    for chunk in fleet.stream(max_tokens=200):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
        if len([p for p in pieces if p]) == 5 and fleet.migrations() == 0:
            fleet.kill_the_serving_worker()
    assert "".join(pieces) == _expected(200)
    assert finish == "length"
    assert (usage.prompt_tokens, usage.completion_tokens) == (4, 200)
    assert fleet.migrations() == 1


def test_after_the_migration_limit_the_stream_ends_with_an_error_event(fleet: Fleet) -> None:
    fleet.start(workers=3, frontend_env={"DYN_MIGRATION_LIMIT": "1"})
    text, kills = "", 0
    with pytest.raises(openai.APIError, match=r"DYN_MIGRATION_LIMIT=1"):
        for chunk in fleet.stream(max_tokens=400):  # 20 s: the kills land mid-stream
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                if text.count("mig:") in (5, 10) and kills < text.count("mig:") // 5:
                    fleet.kill_the_serving_worker()
                    kills += 1
    assert kills == 2
    assert text == _expected(text.count("mig:")), "tokens before the error were in order"
    assert fleet.migrations() == 1


def test_a_stream_migrates_to_a_worker_that_started_after_it(fleet: Fleet) -> None:
    fleet.start(workers=1)  # a rolling restart: the stream's worker goes after a new one came
    text = ""
    # 50 s on the first worker, however slowly the second starts; 2 s on the second.
    for chunk in fleet.stream(max_tokens=1000):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
            if text.count("mig:") == 3:
                fleet.add_worker(FAST_TIME_PER_TOKEN_S)
                fleet.kill_the_serving_worker()
    assert text == _expected(1000)
    assert fleet.migrations() == 1
