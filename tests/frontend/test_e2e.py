"""End to end: the official ``openai`` client against ``python -m lorafleet.frontend`` and real
``python -m lorafleet.worker`` mocker processes on real etcd and NATS.

One frontend and two ``demo`` workers (one with the ``pirate`` adapter) serve the
whole module; tests that start or kill workers use their own model names.
The clients never retry (``max_retries=0``), so every failure would show.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from tests.processes import ServiceProcess, start_frontend, start_worker
from tests.worker.adapters import make_adapter_dir

pytestmark = pytest.mark.slow

LEASE_TTL_S = 2  # tests/processes.py starts workers with DYN_LEASE_TTL=2
LORA_ENV = {"DYN_LORA_ENABLED": "true"}
PROMPT = "tell me a story"  # 4 words: the mocker counts whitespace-split words


@dataclass
class Cluster:
    """A frontend and workers in a namespace of this module alone."""

    log_dir: Path
    etcd_url: str
    nats_url: str
    namespace: str
    frontend: ServiceProcess | None = None
    workers: list[ServiceProcess] = field(default_factory=list)

    def worker(self, model: str, *args: str, wait: bool = True) -> ServiceProcess:
        process = start_worker(
            self.log_dir, etcd_url=self.etcd_url, nats_url=self.nats_url,
            namespace=self.namespace, model=model, args=("--engine", "mocker", *args),
            env=LORA_ENV, wait=wait,
        )  # fmt: skip
        self.workers.append(process)
        return process

    @property
    def url(self) -> str:
        assert self.frontend is not None
        return self.frontend.url

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def model_ids(self) -> set[str]:
        return {model["id"] for model in httpx.get(f"{self.url}/v1/models").json()["data"]}

    def wait_for_models(self, present: set[str], absent: set[str] = frozenset(), timeout_s=10.0):
        deadline = time.monotonic() + timeout_s
        while not (present <= (ids := self.model_ids()) and not absent & ids):
            assert time.monotonic() < deadline, f"models are {ids}; want {present}, not {absent}"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, etcd_url: str, nats_url: str) -> Iterator[Cluster]:
    log_dir = tmp_path_factory.mktemp("e2e")
    cluster = Cluster(log_dir, etcd_url, nats_url, f"e2e{uuid.uuid4().hex[:8]}")
    try:
        first = cluster.worker("demo", "--enable-lora", wait=False)
        second = cluster.worker("demo", "--enable-lora", wait=False)
        cluster.frontend = start_frontend(
            log_dir, etcd_url=etcd_url, nats_url=nats_url, namespace=cluster.namespace,
            args=("--stall-timeout-s", "0.5"),
        )  # fmt: skip
        first.wait_ready()
        second.wait_ready()
        uri = f"file://{make_adapter_dir(log_dir / 'adapters', 'pirate')}"
        body = {"lora_name": "pirate", "source": {"uri": uri}}
        loaded = httpx.post(f"{first.url}/engine/update/load_lora", json=body, timeout=10)
        assert loaded.status_code == 200, loaded.text
        cluster.wait_for_models({"demo", "pirate"})
        yield cluster
    finally:
        for process in [*cluster.workers, cluster.frontend]:
            if process is not None:
                process.kill()


def _worker_requests(worker: ServiceProcess, model: str, outcome: str = "ok") -> float:
    text = httpx.get(f"{worker.url}/metrics").text
    pattern = rf'lorafleet_worker_requests_total{{model="{model}",outcome="{outcome}"}} (\S+)'
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def test_the_worker_with_the_adapter_reports_it_and_its_slots(cluster: Cluster) -> None:
    holder, other = cluster.workers[:2]
    text = httpx.get(f"{holder.url}/metrics").text
    assert 'lorafleet_worker_loaded_adapters{model_name="demo"} 1.0' in text
    assert 'lorafleet_worker_lora_slots{model_name="demo"} 4.0' in text
    assert re.search(
        r'vllm:lora_requests_info\{max_lora="4",[^}]*running_lora_adapters="pirate"', text
    )
    assert "lorafleet_worker_adapter_load_seconds_count 1.0" in text
    idle = httpx.get(f"{other.url}/metrics").text
    assert 'lorafleet_worker_loaded_adapters{model_name="demo"} 0.0' in idle


def test_models_list_shows_each_base_model_and_adapter_once(cluster: Cluster) -> None:
    models = {model.id: model for model in cluster.client().models.list()}
    assert sorted(models) == ["demo", "pirate"]
    assert models["pirate"].parent == "demo"
    assert models["demo"].parent is None
    assert models["pirate"].owned_by == "lorafleet"
    assert cluster.client().models.retrieve("pirate").root == "file:///***/pirate"


def test_chat_whole_and_streamed_agree_and_count_usage(cluster: Cluster) -> None:
    client = cluster.client()
    messages = [{"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(model="demo", messages=messages, max_tokens=5)
    assert whole.choices[0].message.content == "demo:0 demo:1 demo:2 demo:3 demo:4 "
    assert whole.choices[0].finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (4, 5)
    assert whole.usage.total_tokens == 9
    stream = client.chat.completions.create(
        model="pirate", messages=messages, max_tokens=3, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "pirate:0 pirate:1 pirate:2 "
    assert chunks[-1].usage.completion_tokens == 3
    assert chunks[-1].usage.prompt_tokens == 4


def test_the_mocker_reports_certain_tokens_with_the_alternatives_asked_for(
    cluster: Cluster,
) -> None:
    client = cluster.client()
    messages = [{"role": "user", "content": PROMPT}]
    answer = client.chat.completions.create(
        model="pirate", messages=messages, max_tokens=2, logprobs=True, top_logprobs=2
    )
    content = answer.choices[0].logprobs.content
    assert [item.token for item in content] == ["pirate:0 ", "pirate:1 "]
    assert all(item.logprob == 0.0 and len(item.top_logprobs) == 2 for item in content)
    completion = client.completions.create(model="demo", prompt=PROMPT, max_tokens=2, logprobs=0)
    assert completion.choices[0].logprobs.tokens == ["demo:0 ", "demo:1 "]
    assert completion.choices[0].logprobs.token_logprobs == [0.0, 0.0]
    assert completion.choices[0].logprobs.text_offset == [0, 7]


def test_completions_whole_and_streamed_agree_and_count_usage(cluster: Cluster) -> None:
    client = cluster.client()
    whole = client.completions.create(model="pirate", prompt=PROMPT, max_tokens=4)
    assert whole.choices[0].text == "pirate:0 pirate:1 pirate:2 pirate:3 "
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (4, 4)
    streamed = client.completions.create(
        model="pirate", prompt=PROMPT, max_tokens=4, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.total_tokens == 8


def test_round_robin_spreads_requests_evenly_over_both_workers(cluster: Cluster) -> None:
    """``--router round-robin`` takes the workers in turn, whatever was sent to them before
    (the default, ``prefix``, weighs cached prefixes and load instead)."""
    first, second = cluster.workers[:2]
    turns = Cluster(cluster.log_dir, cluster.etcd_url, cluster.nats_url, cluster.namespace)
    turns.frontend = start_frontend(
        cluster.log_dir, etcd_url=cluster.etcd_url, nats_url=cluster.nats_url,
        namespace=cluster.namespace, args=("--router", "round-robin"),
    )  # fmt: skip
    try:
        turns.wait_for_models({"demo"})
        before = [_worker_requests(first, "demo"), _worker_requests(second, "demo")]
        client = turns.client()
        for _ in range(10):
            client.completions.create(model="demo", prompt="x", max_tokens=1)
        after = [_worker_requests(first, "demo"), _worker_requests(second, "demo")]
    finally:
        turns.frontend.kill()
    assert [a - b for a, b in zip(after, before, strict=True)] == [5.0, 5.0]


def test_bad_input_gets_openai_errors_from_the_client(cluster: Cluster) -> None:
    client = cluster.client()
    with pytest.raises(openai.NotFoundError, match="parrot") as missing:
        client.chat.completions.create(model="parrot", messages=[{"role": "user", "content": "x"}])
    assert "demo, pirate" in str(missing.value)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="demo", prompt="x", max_tokens=-1)


def test_a_model_comes_with_its_worker_and_goes_at_once_on_sigterm(cluster: Cluster) -> None:
    worker = cluster.worker("alpha")
    cluster.wait_for_models({"alpha"})
    assert worker.terminate() == 0
    cluster.wait_for_models(set(), absent={"alpha"}, timeout_s=1.0)


def test_a_killed_worker_s_model_goes_within_the_lease_ttl(cluster: Cluster) -> None:
    worker = cluster.worker("beta")
    cluster.wait_for_models({"beta"})
    worker.kill()
    cluster.wait_for_models(set(), absent={"beta"}, timeout_s=LEASE_TTL_S + 1.0)


def test_a_client_that_disconnects_mid_stream_cancels_at_the_worker(cluster: Cluster) -> None:
    worker = cluster.worker(
        "slow", "--mocker-time-per-token-s", "0.02", "--engine-option", "output_tokens=100000"
    )
    cluster.wait_for_models({"slow"})
    body = {"model": "slow", "prompt": "x", "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", f"{cluster.url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        events = (line for line in response.iter_lines() if line.startswith("data: "))
        assert [next(events) for _ in range(3)]
    deadline = time.monotonic() + 5
    while _worker_requests(worker, "slow", "cancelled") < 1:
        assert time.monotonic() < deadline, "the worker never cancelled the request"
        time.sleep(0.05)


async def test_killing_one_of_two_workers_loses_no_request(cluster: Cluster) -> None:
    doomed = cluster.worker("gamma", "--mocker-time-per-token-s", "0.005", wait=False)
    survivor = cluster.worker("gamma", "--mocker-time-per-token-s", "0.005", wait=False)
    doomed.wait_ready()
    survivor.wait_ready()
    client = openai.AsyncOpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0)
    while _worker_requests(doomed, "gamma") < 1 or _worker_requests(survivor, "gamma") < 1:
        await client.completions.create(model="gamma", prompt="x", max_tokens=1)
    done: list[int] = []

    async def run(count: int) -> None:
        for _ in range(count):
            answer = await client.completions.create(model="gamma", prompt="a b", max_tokens=10)
            done.append(answer.usage.completion_tokens)

    load = asyncio.gather(*(run(20) for _ in range(4)))
    while len(done) < 15:
        await asyncio.sleep(0.01)
    doomed.kill()
    await load
    assert done == [10] * 80
    await client.close()
