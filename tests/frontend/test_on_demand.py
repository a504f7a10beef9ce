"""On-demand loading and affinity with real mocker workers (``python -m lorafleet.worker``).

The frontend runs in the test's event loop on a real port; workers are real
processes with LoRA management on. Loads are counted where they happen, at
the worker (``lorafleet_worker_adapter_operations_total``), and after every
scenario each worker's cards in etcd must equal what its engine has loaded.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.fleet.placement import rendezvous_order
from lorafleet.frontend.config import FrontendConfig
from lorafleet.proto.discovery import decode_card
from tests.frontend.conftest import FAST_DISPATCH, run_frontend, wait_for_models
from tests.frontend.stand_in import StandInWorker
from tests.processes import ServiceProcess
from tests.worker.adapters import make_adapter_dir

pytestmark = pytest.mark.slow

PROMPT = "tell me a story"


def _uri(tmp_path: Path, name: str) -> str:
    return f"file://{make_adapter_dir(tmp_path / 'adapters', name)}"


async def _apply(http: httpx.AsyncClient, name: str, uri: str, **fields: object) -> None:
    body = {"name": name, "base_model": "demo", "source": {"uri": uri}, "replicas": 0, **fields}
    response = await http.post("/v1/adapters", json=body)
    assert response.status_code == 201, response.text


async def _complete(http: httpx.AsyncClient, model: str) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 2}
    return await http.post("/v1/completions", json=body, timeout=30)


async def _text(http: httpx.AsyncClient, model: str, *, stream: bool) -> str:
    """The completion's text, whole or gathered from its SSE events."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 2, "stream": stream}
    answer = await http.post("/v1/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    if not stream:
        return str(answer.json()["choices"][0]["text"])
    events = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return "".join(json.loads(event)["choices"][0]["text"] for event in events[:-1])


def _metric(worker: ServiceProcess, pattern: str) -> float:
    found = re.search(pattern + r" (\S+)", httpx.get(f"{worker.url}/metrics").text)
    return float(found.group(1)) if found else 0.0


def _loads(worker: ServiceProcess) -> float:
    return _metric(
        worker,
        r'lorafleet_worker_adapter_operations_total\{operation="load",outcome="ok"\}',
    )


def _served(worker: ServiceProcess, model: str) -> float:
    return _metric(worker, rf'lorafleet_worker_requests_total\{{model="{model}",outcome="ok"\}}')


def _instance_id(worker: ServiceProcess) -> int:
    return int(httpx.get(f"{worker.url}/health").json()["instance_id"], 16)


def _loaded(worker: ServiceProcess) -> set[str]:
    reply = httpx.post(f"{worker.url}/engine/update/list_loras", json={})
    return set(reply.json()["loras"])


async def _assert_cards_match_engines(workers, etcd, namespace: str) -> None:
    """The lifecycle's invariant on every worker: a card exists exactly when loaded."""
    carded: dict[int, set[str]] = {}
    for kv in await etcd.get_prefix(f"v1/mdc/{namespace}/".encode()):
        card = decode_card(kv.value)
        if card.lora is not None:
            carded.setdefault(int(kv.key.decode().split("/")[5], 16), set()).add(card.lora.name)
    for worker in workers:
        assert carded.get(_instance_id(worker), set()) == _loaded(worker), worker.url


async def test_twenty_first_requests_cause_one_load_where_placement_ranks_first(
    lora_workers, frontend, etcd, namespace, tmp_path
) -> None:
    workers = await asyncio.to_thread(lora_workers, 2)
    await wait_for_models(frontend, {"demo"})
    await _apply(frontend.http, "pirate", _uri(tmp_path, "pirate"))

    answers = await asyncio.gather(*(_complete(frontend.http, "pirate") for _ in range(20)))

    assert [a.status_code for a in answers] == [200] * 20
    assert {a.json()["choices"][0]["text"] for a in answers} == {"pirate:0 pirate:1 "}
    assert sum(_loads(worker) for worker in workers) == 1
    by_id = {_instance_id(worker): worker for worker in workers}
    first = by_id[rendezvous_order("pirate", by_id)[0]]
    assert _loaded(first) == {"pirate"}
    assert _served(first, "pirate") == 20  # affinity: only the instance that has it
    status = (await frontend.http.get("/v1/adapters/pirate")).json()
    assert status["instances"] == [f"{_instance_id(first):x}"]
    models = {m["id"]: m for m in (await frontend.http.get("/v1/models")).json()["data"]}
    assert models["pirate"]["loaded"] is True
    await _assert_cards_match_engines(workers, etcd, namespace)

    assert (await frontend.http.delete("/v1/adapters/pirate")).status_code == 200
    await wait_for_models(frontend, {"demo"})  # the worker unloads the on-demand copy
    assert (await _complete(frontend.http, "pirate")).status_code == 404
    await _assert_cards_match_engines(workers, etcd, namespace)


async def test_two_slots_three_adapters_in_turn_evict_the_least_recently_used(
    lora_workers, frontend, etcd, namespace, tmp_path
) -> None:
    (worker,) = await asyncio.to_thread(lora_workers, 1, "--max-loras", "2")
    await wait_for_models(frontend, {"demo"})
    names = ["alpha", "beta", "gamma"]
    for name in names:
        await _apply(frontend.http, name, _uri(tmp_path, name))

    texts = [(await _complete(frontend.http, name)).json()["choices"][0]["text"] for name in names]
    assert texts == [f"{name}:0 {name}:1 " for name in names]
    assert _loaded(worker) == {"beta", "gamma"}  # alpha was the least recently used

    for turn, name in enumerate(names * 2):
        assert await _text(frontend.http, name, stream=turn % 2 == 1) == f"{name}:0 {name}:1 "
    assert _loads(worker) == 9  # each one was evicted before its turn came again
    assert len(_loaded(worker)) == 2
    await _assert_cards_match_engines([worker], etcd, namespace)


async def test_a_failed_load_answers_the_worker_s_error(
    lora_workers, frontend, etcd, namespace, tmp_path
) -> None:
    (worker,) = await asyncio.to_thread(lora_workers, 1, "--max-loras", "1")
    await _apply(frontend.http, "keeper", _uri(tmp_path, "keeper"), replicas=1, pinned=True)
    await wait_for_models(frontend, {"demo", "keeper"})  # placed, pinned: never evicted
    await _apply(frontend.http, "other", _uri(tmp_path, "other"))
    await _apply(frontend.http, "ghost", "file:///nonexistent/ghost")

    full = await _complete(frontend.http, "other")
    assert full.status_code == 429
    assert full.json()["error"]["code"] == "capacity"
    assert "pinned or busy" in full.json()["error"]["message"]
    missing = await _complete(frontend.http, "ghost")
    assert missing.status_code == 424, missing.text  # adapter_load_failed, not "no such model"
    message = missing.json()["error"]["message"]
    assert "file:///***/ghost: no such file or directory" in message
    assert "nonexistent" not in message  # the worker's paths are not the client's business
    assert (await _complete(frontend.http, "keeper")).status_code == 200
    await _assert_cards_match_engines([worker], etcd, namespace)


async def test_on_demand_loads_carry_the_workers_token(
    lora_workers, frontend, etcd_url, nats_url, namespace, tmp_path
) -> None:
    env = {"DYN_SYSTEM_AUTH_TOKEN": "w0rk3r"}
    (worker,) = await asyncio.to_thread(lora_workers, 1, env=env)
    await _apply(frontend.http, "pirate", _uri(tmp_path, "pirate"))

    refused = await _complete(frontend.http, "pirate")  # ``frontend`` has no worker token
    assert refused.status_code == 502, refused.text
    assert "DYN_SYSTEM_AUTH_TOKEN" in refused.json()["error"]["message"]
    assert _loaded(worker) == set()
    config = FrontendConfig(namespace=namespace,
                            etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url,
                            dispatch=FAST_DISPATCH, worker_token="w0rk3r")  # fmt: skip
    async with run_frontend(config) as holding_the_token:
        answer = await _complete(holding_the_token.http, "pirate")
    assert answer.status_code == 200, answer.text
    assert _loaded(worker) == {"pirate"}


async def test_a_load_that_never_answers_times_out_with_503(
    workers, nats_url, etcd, namespace, etcd_url
) -> None:
    mute_to_updates = await StandInWorker(nats_url, etcd, namespace, "demo").start()
    workers.append(mute_to_updates)  # answers pings, never load_lora
    config = FrontendConfig(namespace=namespace,
                            etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url,
                            dispatch=FAST_DISPATCH, on_demand_timeout_s=0.5)  # fmt: skip
    async with run_frontend(config) as running:
        await wait_for_models(running, {"demo"})
        await _apply(running.http, "slowpoke", "file:///adapters/slowpoke")
        answers = await asyncio.gather(*(_complete(running.http, "slowpoke") for _ in range(3)))
        assert [a.status_code for a in answers] == [503] * 3
        assert "not loaded within 0.5 s" in answers[0].json()["error"]["message"]
        metrics = (await running.http.get("/metrics")).text
        assert 'lorafleet_frontend_on_demand_loads_total{outcome="timeout"} 1.0' in metrics


async def _cold_request(frontend, name: str) -> httpx.Response:
    """One request for ``name``, desired and on no instance: the stand-in is asked to load it."""
    await wait_for_models(frontend, {"demo"})
    await _apply(frontend.http, name, f"file:///adapters/{name}")
    return await _complete(frontend.http, name)


async def test_a_load_whose_card_never_shows_is_asked_for_again(
    workers, nats_url, etcd, namespace, frontend
) -> None:
    """The worker answered the load, but its card went before the frontend saw it (evicted
    at once): the frontend loads again instead of waiting out its on-demand timeout."""
    forgetful = await StandInWorker(nats_url, etcd, namespace, "demo", answer_loads=True,
                                    lose_first_card=True).start()  # fmt: skip
    workers.append(forgetful)
    answer = await _cold_request(frontend, "shy")
    assert answer.status_code == 200, answer.text
    assert forgetful.loads == ["shy", "shy"]


async def test_a_cold_load_evicts_a_placed_copy_only_when_every_instance_must(
    workers, nats_url, etcd, namespace, frontend
) -> None:
    """Every slot holds a placed copy: the first ask keeps them (429), the second evicts one
    rather than failing the request."""
    placed_full = await StandInWorker(nats_url, etcd, namespace, "demo", answer_loads=True,
                                      only_placed_copies=True).start()  # fmt: skip
    workers.append(placed_full)
    answer = await _cold_request(frontend, "cold")
    assert answer.status_code == 200, answer.text
    assert placed_full.engine.load_asks == [False, True]


async def test_adapter_requests_go_to_the_least_busy_instance_that_has_it(
    workers, nats_url, etcd, namespace, frontend
) -> None:
    pair = [
        await StandInWorker(
            nats_url, etcd, namespace, "demo", adapters=("pirate",), token_delay_s=0.05
        ).start()
        for _ in range(2)
    ]
    workers.extend(pair)
    await wait_for_models(frontend, {"demo", "pirate"})
    body = {"model": "pirate", "prompt": "x", "max_tokens": 20}
    slow = asyncio.create_task(frontend.http.post("/v1/completions", json=body))
    while sum(len(worker.generated) for worker in pair) == 0:
        await asyncio.sleep(0.01)
    busy, idle = pair if pair[0].generated else pair[::-1]
    for _ in range(4):  # round robin would send two of them to ``busy``
        answer = await frontend.http.post("/v1/completions", json={**body, "max_tokens": 1})
        assert answer.status_code == 200
    assert (len(busy.generated), len(idle.generated)) == (1, 4)
    assert (await slow).status_code == 200


async def _stand_ins(
    workers: list[StandInWorker], nats_url: str, etcd, namespace: str, *options: dict
) -> list[StandInWorker]:
    """Start one stand-in of ``demo`` per ``options``; the ``workers`` fixture stops them."""
    started = [
        await StandInWorker(nats_url, etcd, namespace, "demo", **each).start() for each in options
    ]
    workers.extend(started)
    return started


async def test_an_adapter_whose_only_instance_died_is_loaded_again_elsewhere(
    workers, nats_url, etcd, namespace, frontend
) -> None:
    dead, alive = await _stand_ins(
        workers, nats_url, etcd, namespace,
        {"adapters": ("pirate",), "answer_loads": True}, {"answer_loads": True},
    )  # fmt: skip
    await _apply(frontend.http, "pirate", "file:///a/pirate")
    await wait_for_models(frontend, {"demo", "pirate"})
    await dead.stop(retract=False)  # crashed: its cards stay until the lease expires

    for stream in (False, True):
        body = {"model": "pirate", "prompt": "x", "max_tokens": 2, "stream": stream}
        answer = await frontend.http.post("/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
    assert alive.loads == ["pirate"]
    assert [request.model for request in alive.generated] == ["pirate", "pirate"]


async def test_only_instances_with_lora_management_are_asked_to_load(
    workers, nats_url, etcd, namespace, frontend
) -> None:
    without_lora, with_lora = await _stand_ins(
        workers, nats_url, etcd, namespace, {"enable_lora": False}, {"answer_loads": True}
    )
    ids = [without_lora.instance_id, with_lora.instance_id]
    # a name that rendezvous hashing ranks first on the instance that cannot load it
    name = next(n for i in range(100) if rendezvous_order(n := f"a{i}", ids)[0] == ids[0])
    await _apply(frontend.http, name, f"file:///a/{name}")
    await wait_for_models(frontend, {"demo"})

    answer = await _complete(frontend.http, name)
    assert answer.status_code == 200, answer.text
    assert with_lora.loads == [name]
    assert without_lora.updates == []
