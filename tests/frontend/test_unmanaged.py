"""Every adapter the fleet serves is seen: declared or loaded straight onto a worker
(``unmanaged``), or such an adapter that placement evicted (``evicted``), with its digest.

A stand-in worker publishes the cards, with the digest a real worker puts there
(``versions`` makes real workers fill it); where a test needs a worker's load record
with an eviction, the test writes it through the real etcd and says so: a stand-in
for the worker's publication.
"""

from __future__ import annotations

import asyncio
import json
import time

import msgspec
import pytest

from lorafleet.discovery.keys import load_key
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.launch.fleet_status import print_fleet
from lorafleet.launch.status import print_status
from lorafleet.proto.fleet_load import EvictedAdapter, InstanceLoad, encode_instance_load
from tests.frontend.conftest import wait_for_models
from tests.frontend.stand_in import COMPONENT, ENDPOINT, StandInWorker

ROBOT_DIGEST = "sha256:" + "ab" * 32
OLD_DIGEST = "sha256:" + "cd" * 32


@pytest.fixture
async def fleet(workers, nats_url, etcd, namespace, frontend) -> StandInWorker:
    """``demo`` with ``robot`` loaded straight onto it and ``pirate`` declared."""
    worker = await StandInWorker(nats_url, etcd, namespace, "demo").start()
    workers.append(worker)
    card = worker.card("robot")
    assert card.lora is not None
    lora = msgspec.structs.replace(card.lora, digest=ROBOT_DIGEST)
    await worker.endpoint.register_model(msgspec.structs.replace(card, lora=lora))
    body = {"name": "pirate", "base_model": "demo", "source": {"uri": "s3://bucket/pirate"}}
    assert (await frontend.http.post("/v1/adapters", json=body)).status_code == 201
    await wait_for_models(frontend, {"demo", "robot"})
    return worker


async def test_an_adapter_loaded_straight_onto_a_worker_is_listed_unmanaged_with_its_digest(
    fleet, frontend, capsys
) -> None:
    listed = (await frontend.http.get("/v1/adapters")).json()["data"]
    models = {
        entry["id"]: entry for entry in (await frontend.http.get("/v1/models")).json()["data"]
    }

    assert [(status["name"], status["state"]) for status in listed] == [
        ("pirate", "pending"), ("robot", "unmanaged"),
    ]  # fmt: skip
    robot = listed[1]
    assert robot["instances"] == [f"{fleet.instance_id:x}"]
    assert (robot["digest"], robot["base_model"]) == (ROBOT_DIGEST, "demo")
    assert robot["source"]["uri"] == "file:///***/robot"
    assert (await frontend.http.get("/v1/adapters/robot")).json() == robot
    refused = await frontend.http.delete("/v1/adapters/robot")
    assert refused.status_code == 404 and "/v1/unload_lora_adapter" in refused.text
    assert models["robot"]["digest"] == ROBOT_DIGEST and models["demo"]["digest"] is None
    # what `lorafleet lora list` prints after the workers' table
    await asyncio.to_thread(print_fleet, frontend.url, as_json=False)
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line}
    assert rows["ADAPTER"] == [
        "ADAPTER", "STATE", "MIN", "MAX", "INSTANCES", "DEMAND/S", "DIGEST", "DETAIL",
    ]  # fmt: skip
    assert rows["robot"][1] == "unmanaged" and rows["robot"][6] == "sha256:" + "ab" * 6


async def test_an_unmanaged_adapter_placement_evicted_is_listed_with_when_and_why(
    fleet, frontend, etcd, namespace, capsys
) -> None:
    now = time.time()
    gone = EvictedAdapter(base_model="demo", uri="file:///srv/adapters/old", digest=OLD_DIGEST,
                          at=now, reason="its slot went to pinned adapter 'pirate'")  # fmt: skip
    record = InstanceLoad(base_model="demo", max_loras=4, evicted={"old": gone})
    key = load_key(namespace, COMPONENT, ENDPOINT, fleet.instance_id)
    await etcd.put(key.encode(), encode_instance_load(record))  # the worker's publication
    loads = frontend.app.state.services.loads
    await loads.cache.wait_until(lambda _: loads.of(fleet.instance_id) is not None, timeout_s=30)

    old = (await frontend.http.get("/v1/adapters/old")).json()

    assert (old["state"], old["digest"], old["instances"]) == ("evicted", OLD_DIGEST, [])
    assert old["source"]["uri"] == "file:///***/old"  # no path on a worker's disk
    assert old["evicted"]["instance"] == f"{fleet.instance_id:x}"
    assert old["evicted"]["reason"] == "its slot went to pinned adapter 'pirate'"
    names = [status["name"] for status in (await frontend.http.get("/v1/adapters")).json()["data"]]
    assert names == ["old", "pirate", "robot"]
    await asyncio.to_thread(print_fleet, frontend.url, as_json=False)
    out = capsys.readouterr().out
    assert f"evicted from {fleet.instance_id:x} at" in out and "pinned adapter 'pirate'" in out


async def test_unmanaged_and_evicted_adapters_show_the_demand_of_the_load_records(
    fleet, frontend, etcd, namespace
) -> None:
    gone = EvictedAdapter(base_model="demo", uri="file:///srv/adapters/old", digest=OLD_DIGEST,
                          at=time.time(), reason="its slot went to a placed adapter")  # fmt: skip
    record = InstanceLoad(base_model="demo", max_loras=4, evicted={"old": gone},
                          demand={"robot": 141.0, "old": 0.25})  # fmt: skip
    key = load_key(namespace, COMPONENT, ENDPOINT, fleet.instance_id)
    await etcd.put(key.encode(), encode_instance_load(record))  # the worker's publication
    loads = frontend.app.state.services.loads
    await loads.cache.wait_until(lambda _: loads.of(fleet.instance_id) is not None, timeout_s=30)

    listed = (await frontend.http.get("/v1/adapters")).json()["data"]
    robot = (await frontend.http.get("/v1/adapters/robot")).json()

    shown = {status["name"]: (status["state"], status["demand"]) for status in listed}
    assert shown["robot"] == ("unmanaged", 141.0) and robot["demand"] == 141.0
    assert shown["old"] == ("evicted", 0.25)


async def test_a_request_for_an_evicted_unmanaged_adapter_loads_it_back_from_its_source(
    workers, nats_url, etcd, namespace, frontend
) -> None:
    worker = await StandInWorker(nats_url, etcd, namespace, "demo", answer_loads=True).start()
    workers.append(worker)
    await wait_for_models(frontend, {"demo"})
    gone = EvictedAdapter(base_model="demo", uri="s3://bucket/old", digest=OLD_DIGEST,
                          at=time.time(), reason="its slot went to a desired adapter")  # fmt: skip
    record = InstanceLoad(base_model="demo", max_loras=4, evicted={"old": gone})
    key = load_key(namespace, COMPONENT, ENDPOINT, worker.instance_id)
    await etcd.put(key.encode(), encode_instance_load(record))  # the worker's publication
    loads = frontend.app.state.services.loads
    await loads.cache.wait_until(lambda _: loads.of(worker.instance_id) is not None, timeout_s=30)

    body = {"model": "old", "prompt": "hi", "max_tokens": 2}
    answer = await frontend.http.post("/v1/completions", json=body, timeout=30)

    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "old"
    assert worker.loads == ["old"]


async def test_adapters_and_status_show_each_instances_prefix_cache_hit_ratio(
    fleet, frontend, etcd, etcd_url, namespace, capsys
) -> None:
    record = InstanceLoad(base_model="demo", max_loras=4, prefix_cache_queries=800,
                          prefix_cache_hits=600)  # fmt: skip
    key = load_key(namespace, COMPONENT, ENDPOINT, fleet.instance_id)
    await etcd.put(key.encode(), encode_instance_load(record))  # the worker's publication
    loads = frontend.app.state.services.loads
    await loads.cache.wait_until(lambda _: loads.of(fleet.instance_id) is not None, timeout_s=30)

    robot = (await frontend.http.get("/v1/adapters/robot")).json()
    assert robot["cache_hit_ratio"] == {f"{fleet.instance_id:x}": 0.75}
    settings = EtcdSettings.from_endpoints(etcd_url)
    await asyncio.to_thread(print_status, settings, namespace, frontend.url, as_json=True)
    (worker,) = json.loads(capsys.readouterr().out)["workers"]
    assert (worker["instance"], worker["cache_hits"]) == (f"{fleet.instance_id:x}", "75%")
