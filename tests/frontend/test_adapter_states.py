"""Adapter states, failed adapters, least-loaded on-demand loads and the wait queue.

Real mocker workers (``python -m lorafleet.worker``) load and fail; the frontend runs in the
test's event loop on a real port. Where a test needs a worker's load record
(``v1/load/...``) that a worker does not publish by itself yet, the test writes it
through the real etcd and says so: a stand-in for the worker's publication.
After every scenario with real workers, each worker's cards in etcd must equal
what its engine has loaded.
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime

import httpx
import openai
import pytest

from lorafleet.discovery.keys import load_key
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.fleet.placement import rendezvous_order
from lorafleet.frontend.__main__ import build_parser, config_from_args
from lorafleet.frontend.config import FrontendConfig
from lorafleet.launch.cli import main as lorafleet
from lorafleet.proto.fleet_load import InstanceLoad, LoadFailure, encode_instance_load
from tests.frontend.conftest import FAST_DISPATCH, run_frontend, wait_for_models
from tests.frontend.stand_in import COMPONENT, ENDPOINT, StandInWorker
from tests.frontend.test_adapter_integrity import _status_when
from tests.frontend.test_on_demand import (
    _apply,
    _assert_cards_match_engines,
    _complete,
    _instance_id,
    _loaded,
    _uri,
)
from tests.worker.test_adapter_trust import _pickled_adapter

pytestmark = pytest.mark.slow


def _load_ops(worker) -> float:
    """Every load the worker's lifecycle ran, whatever its outcome."""
    text = httpx.get(f"{worker.url}/metrics").text
    pattern = r'lorafleet_worker_adapter_operations_total\{operation="load",outcome="[^"]*"\} (\S+)'
    return sum(float(value) for value in re.findall(pattern, text))


async def _put_record(etcd, namespace: str, instance_id: int, load: InstanceLoad) -> None:
    """Write a worker's load record, standing in for the worker's own publication."""
    key = load_key(namespace, COMPONENT, ENDPOINT, instance_id)
    await etcd.put(key.encode(), encode_instance_load(load))


async def _wait_for_record(frontend, instance_id: int) -> None:
    loads = frontend.app.state.services.loads
    await loads.cache.wait_until(lambda _: loads.of(instance_id) is not None, timeout_s=30)


def _models(frontend_url: str) -> dict[str, object]:
    client = openai.OpenAI(base_url=f"{frontend_url}/v1", api_key="none", max_retries=0)
    return {model.id: model for model in client.models.list()}


async def test_an_adapter_that_cannot_load_is_failed_with_its_error_and_answers_424_at_once(
    lora_workers, frontend, etcd, etcd_url, namespace, tmp_path, capsys
) -> None:
    (worker,) = await asyncio.to_thread(
        lora_workers, 1, "--engine-option", 'fail_add_adapter="broken.*"'
    )
    await wait_for_models(frontend, {"demo"})
    await _apply(frontend.http, "broken", _uri(tmp_path, "broken"))
    await _apply(frontend.http, "ghost", "file:///nonexistent/ghost")
    worker_id = f"{_instance_id(worker):x}"

    first = await _complete(frontend.http, "broken")
    again = await _complete(frontend.http, "broken")

    for answer in (first, again):
        assert answer.status_code == 424, answer.text
        error = answer.json()["error"]
        assert error["code"] == "adapter_load_failed"
        assert f"worker instance {worker_id}" in error["message"]
        assert "adding adapter 'broken' failed as configured" in error["message"]
        assert "apply it again" in error["message"]
    assert _load_ops(worker) == 1  # the second request did not wait for another attempt
    status = (await frontend.http.get("/v1/adapters/broken")).json()
    assert status["state"] == "failed"
    assert status["error"]["instance"] == worker_id
    assert "failed as configured" in status["error"]["message"]
    assert abs(datetime.fromisoformat(status["error"]["at"]).timestamp() - time.time()) < 600
    assert (status["instances"], status["min_replicas"], status["max_replicas"]) == ([], 0, 0)

    ghost = await _complete(frontend.http, "ghost")
    assert ghost.status_code == 424, ghost.text
    message = ghost.json()["error"]["message"]
    assert "not_found: LoRA source file:///***/ghost: no such file or directory" in message
    assert "nonexistent" not in message  # the worker's paths are not the client's business

    models = await asyncio.to_thread(_models, frontend.url)  # the real client parses the list
    assert set(models) == {"demo", "broken", "ghost"}
    listed = {m["id"]: m for m in (await frontend.http.get("/v1/models")).json()["data"]}
    assert listed["ghost"]["status"]["state"] == "failed"
    assert listed["ghost"]["status"]["error"]["code"] == "not_found"
    assert listed["broken"]["loaded"] is False and listed["demo"]["status"] is None
    argv = ["lora", "list", "--etcd-endpoints", etcd_url, "--namespace", namespace,
            "--frontend", frontend.url]  # fmt: skip
    assert await asyncio.to_thread(lorafleet, argv) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line}
    assert rows["ADAPTER"][:5] == ["ADAPTER", "STATE", "MIN", "MAX", "INSTANCES"]
    assert rows["ghost"][1:5] == ["failed", "0", "0", "-"]
    await _assert_cards_match_engines([worker], etcd, namespace)


async def test_a_placed_adapter_s_failure_shows_the_worker_s_whole_message_and_its_fix(
    lora_workers, frontend, tmp_path
) -> None:
    await asyncio.to_thread(lora_workers, 1)
    await wait_for_models(frontend, {"demo"})
    uri = _pickled_adapter(tmp_path / ("deep-" * 20), "pickled")  # a message over 256 chars
    await _apply(frontend.http, "pickled", uri, replicas=1)  # placement loads it, and fails

    status = await _status_when(frontend.http, "pickled", lambda s: s["state"] == "failed")

    message = status["error"]["message"]
    assert "set DYN_LORA_ALLOW_PICKLE=true on the worker" in message, message
    assert "characters)" not in message and str(tmp_path) not in message


async def test_a_failure_in_a_worker_s_record_is_shown_and_answered_without_a_load(
    workers, nats_url, etcd, namespace, frontend
) -> None:
    stand_in = await StandInWorker(nats_url, etcd, namespace, "demo").start()
    workers.append(stand_in)  # never answers a load: one asked for would hang the request
    await wait_for_models(frontend, {"demo"})
    await _apply(frontend.http, "bad", "file:///nonexistent", replicas=1)
    now = time.time()
    failure = LoadFailure(code="not_found", message="LoRA source file:///models/bad: no such file",
                          at=now, attempts=3, retry_at=now + 120)  # fmt: skip
    record = InstanceLoad(base_model="demo", max_loras=4, failed={"bad": failure},
                          demand={"bad": 0.25})  # fmt: skip
    await _put_record(etcd, namespace, stand_in.instance_id, record)
    await _wait_for_record(frontend, stand_in.instance_id)

    answer = await _complete(frontend.http, "bad")

    assert answer.status_code == 424, answer.text
    message = answer.json()["error"]["message"]
    assert "not_found: LoRA source file:///***/bad: no such file" in message
    assert stand_in.updates == []  # answered from the record, no load attempted
    status = (await frontend.http.get("/v1/adapters/bad")).json()
    assert (status["state"], status["demand"]) == ("failed", 0.25)
    assert status["error"]["attempts"] == 3 and status["error"]["retry_at"] is not None

    loading = InstanceLoad(base_model="demo", max_loras=4, loading=["bad"])
    await _put_record(etcd, namespace, stand_in.instance_id, loading)
    async with asyncio.timeout(5):
        while (await frontend.http.get("/v1/adapters/bad")).json()["state"] != "loading":
            await asyncio.sleep(0.02)


async def test_lora_apply_of_a_missing_source_says_failed_and_requests_get_its_error(
    lora_workers, frontend, etcd, namespace, capsys
) -> None:
    (worker,) = await asyncio.to_thread(lora_workers, 1)
    await wait_for_models(frontend, {"demo"})
    argv = ["lora", "apply", "bad", "file:///nonexistent", "--base-model", "demo",
            "--frontend", frontend.url]  # fmt: skip

    assert await asyncio.to_thread(lorafleet, argv) == 1

    printed = capsys.readouterr().out
    assert f"bad: failed on instance {_instance_id(worker):x}" in printed
    assert "not_found: LoRA source file:///***/nonexistent: no such file or directory" in printed
    answer = await _complete(frontend.http, "bad")  # placement's retries go on meanwhile
    assert answer.status_code == 424, answer.text
    assert "not_found: LoRA source file:///***" in answer.json()["error"]["message"]
    listed = {m["id"]: m for m in (await frontend.http.get("/v1/models")).json()["data"]}
    assert listed["bad"]["status"]["state"] == "failed"
    await _assert_cards_match_engines([worker], etcd, namespace)


async def test_lora_apply_prints_that_an_adapter_failed_with_its_error(
    workers, nats_url, etcd, namespace, frontend, capsys
) -> None:
    stand_in = await StandInWorker(nats_url, etcd, namespace, "demo").start()
    workers.append(stand_in)
    failure = LoadFailure(code="not_found", message="LoRA source file:///models/bad: no such file",
                          at=time.time())  # fmt: skip
    record = InstanceLoad(base_model="demo", max_loras=4, failed={"bad": failure})
    await _put_record(etcd, namespace, stand_in.instance_id, record)
    await _wait_for_record(frontend, stand_in.instance_id)

    argv = ["lora", "apply", "bad", "file:///nonexistent", "--base-model", "demo",
            "--min-replicas", "1", "--max-replicas", "3", "--frontend", frontend.url]  # fmt: skip
    assert await asyncio.to_thread(lorafleet, argv) == 1

    printed = capsys.readouterr().out
    assert f"bad: failed on instance {stand_in.instance_id:x}" in printed
    assert "not_found: LoRA source file:///***/bad: no such file" in printed
    spec = frontend.app.state.services.desired.get("bad")
    assert (spec.min_replicas, spec.max_replicas) == (1, 3)


async def test_on_demand_goes_to_the_instance_with_a_free_slot_when_another_is_full(
    lora_workers, frontend, etcd, namespace, tmp_path
) -> None:
    workers = await asyncio.to_thread(lora_workers, 2, "--max-loras", "1")
    await wait_for_models(frontend, {"demo"})
    by_id = {_instance_id(worker): worker for worker in workers}
    first_id, second_id = rendezvous_order("pirate", by_id)
    full, free = by_id[first_id], by_id[second_id]
    body = {"lora_name": "filler", "source": {"uri": _uri(tmp_path, "filler")}}
    async with httpx.AsyncClient(timeout=30) as http:
        filler = await http.post(f"{full.url}/engine/update/load_lora", json=body)
    assert filler.status_code == 200, filler.text
    loads = frontend.app.state.services.loads

    def full_and_free_seen(_: object) -> bool:  # the full worker's own record says so
        full_load, free_load = loads.of(first_id), loads.of(second_id)
        return full_load is not None and full_load.free_slots == 0 and free_load is not None

    await loads.cache.wait_until(full_and_free_seen, timeout_s=30)
    await _apply(frontend.http, "pirate", _uri(tmp_path, "pirate"))

    answer = await _complete(frontend.http, "pirate")

    assert answer.status_code == 200, answer.text
    assert (_loaded(full), _loaded(free)) == ({"filler"}, {"pirate"})  # nothing evicted
    status = (await frontend.http.get("/v1/adapters/pirate")).json()
    assert (status["state"], status["instances"]) == ("placed", [f"{second_id:x}"])
    await _assert_cards_match_engines(workers, etcd, namespace)


async def test_requests_past_the_wait_queue_of_a_running_load_get_429(
    lora_workers, etcd_url, nats_url, etcd, namespace, tmp_path
) -> None:
    (worker,) = await asyncio.to_thread(lora_workers, 1, "--engine-option", "add_adapter_delay_s=3")
    config = FrontendConfig(namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url, dispatch=FAST_DISPATCH,
                            on_demand_queue=2)  # fmt: skip
    async with run_frontend(config) as running:
        await wait_for_models(running, {"demo"})
        await _apply(running.http, "slow", _uri(tmp_path, "slow"))
        loader = running.app.state.services.resolver.loader
        first = asyncio.create_task(_complete(running.http, "slow"))
        async with asyncio.timeout(10):
            while "slow" not in loader.loading:  # the load runs (for 3 s) from now on
                await asyncio.sleep(0.01)
        status = (await running.http.get("/v1/adapters/slow")).json()
        later = await asyncio.gather(*(_complete(running.http, "slow") for _ in range(4)))
        answers = [await first, *later]

    codes = sorted(answer.status_code for answer in answers)
    assert status["state"] == "loading"
    assert codes == [200, 200, 429, 429, 429]  # two wait (the queue), three are told to retry
    refused = next(answer for answer in answers if answer.status_code == 429).json()["error"]
    assert refused["code"] == "capacity"
    assert "2 requests already wait" in refused["message"]
    assert "retry later" in refused["message"]
    await _assert_cards_match_engines([worker], etcd, namespace)


def test_the_wait_queue_bound_comes_from_its_flag_or_variable_and_is_at_least_one(
    monkeypatch,
) -> None:
    monkeypatch.setenv("DYN_ON_DEMAND_QUEUE", "32")
    assert config_from_args(build_parser().parse_args([])).on_demand_queue == 32
    flagged = build_parser().parse_args(["--on-demand-queue", "8"])
    assert config_from_args(flagged).on_demand_queue == 8
    with pytest.raises(
        ValueError, match=r"--on-demand-queue \(DYN_ON_DEMAND_QUEUE\) must be >= 1, got 0"
    ):
        config_from_args(build_parser().parse_args(["--on-demand-queue", "0"]))
