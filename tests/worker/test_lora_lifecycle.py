"""The LoRA lifecycle on a real mocker worker: load, unload, list, gating, faults, bad input.

After every fault the invariant is checked against etcd and the engine:
a card exists exactly when its adapter is loaded.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
import msgspec
import nats
import pytest

from lorafleet.proto.discovery import decode_card, decode_instance
from lorafleet.proto.inference import (
    FinalChunk,
    GenerateRequest,
    SamplingParams,
    UpdateReply,
    UpdateRequest,
    encode_msg,
)
from lorafleet.proto.naming import lora_id
from tests.faults import TcpProxy
from tests.processes import ServiceProcess
from tests.worker.adapters import adapter_digest, make_adapter_dir
from tests.worker.streaming import stream

LORA_ENV = {"DYN_LORA_ENABLED": "true"}
DIGEST = adapter_digest()
SEED = 7


@pytest.fixture
def adapters(tmp_path: Path) -> dict[str, str]:
    """file:// URIs of a few adapters by name."""
    names = ["pirate", "robot", "org/chef", *(f"a{i}" for i in range(6)), "broken1"]
    return {name: f"file://{make_adapter_dir(tmp_path / 'adapters', name)}" for name in names}


@pytest.fixture
def lora_worker(worker_factory, tmp_path: Path):
    def start(*args: str, env: dict[str, str] | None = None, **kwargs) -> ServiceProcess:
        full_env = {**LORA_ENV, "DYN_LORA_PATH": str(tmp_path / "cache"), **(env or {})}
        return worker_factory("--enable-lora", "--max-loras", "8", *args, env=full_env, **kwargs)

    return start


async def _cards(etcd, namespace: str) -> dict[str, int]:
    return {
        name: lora_int_id for name, (lora_int_id, _) in (await _versions(etcd, namespace)).items()
    }


async def _versions(etcd, namespace: str) -> dict[str, tuple[int, str]]:
    """Adapter name -> (lora_id, digest), as the cards in etcd say."""
    listing = await etcd.get_prefix(f"v1/mdc/{namespace}/".encode())
    cards = [decode_card(kv.value).lora for kv in listing]
    return {lora.name: (lora.lora_id, lora.digest) for lora in cards if lora}


async def _loaded(client: httpx.AsyncClient) -> dict[str, int]:
    return {name: lora_int_id for name, (lora_int_id, _) in (await _held(client)).items()}


async def _held(client: httpx.AsyncClient) -> dict[str, tuple[int, str]]:
    """Adapter name -> (lora_id, digest), as the engine's listing says."""
    response = await client.post("/engine/update/list_loras", json={})
    assert response.status_code == 200, response.text
    listed = response.json()
    return {
        name: (lora_int_id, listed["digests"][name])
        for name, lora_int_id in listed["loras"].items()
    }


async def assert_invariant(client: httpx.AsyncClient, etcd, namespace: str) -> None:
    """A card is in etcd exactly when its adapter is loaded in the engine, with the id and
    digest of the version the engine holds."""
    async with asyncio.timeout(10):  # the lease keeper may still be reconciling after a fault
        while (cards := await _versions(etcd, namespace)) != (held := await _held(client)):
            await asyncio.sleep(0.1)
    assert cards == held


def _load_body(name: str, uri: str) -> dict:
    return {"lora_name": name, "source": {"uri": uri}}


async def test_load_publishes_card_and_unload_retracts_it(lora_worker, etcd, namespace, adapters):
    worker = lora_worker()
    async with httpx.AsyncClient(base_url=worker.url) as client:
        response = await client.post(
            "/engine/update/load_lora", json=_load_body("pirate", adapters["pirate"])
        )
        assert response.status_code == 200, response.text
        assert response.json() == {
            "status": "success",
            "message": f"adapter 'pirate' loaded from {adapters['pirate']} ({DIGEST})",
            "lora_name": "pirate", "lora_id": lora_id("pirate", DIGEST), "digest": DIGEST,
            "warnings": [],
        }  # fmt: skip
        listing = await etcd.get_prefix(f"v1/mdc/{namespace}/".encode())
        (card,) = [decode_card(kv.value) for kv in listing if decode_card(kv.value).lora]
        (base,) = [decode_card(kv.value) for kv in listing if not decode_card(kv.value).lora]
        assert base.runtime_config.enable_lora and base.runtime_config.max_loras == 8
        assert card.display_name == "pirate" and card.lora.base_model == "demo"
        assert card.lora.uri == adapters["pirate"] and card.lora.local_path.endswith("pirate")
        assert (card.lora.digest, card.lora.lora_id) == (DIGEST, lora_id("pirate", DIGEST))
        response = await client.post("/engine/update/unload_lora", json={"lora_name": "pirate"})
        assert response.status_code == 200 and response.json()["status"] == "success"
        assert await _cards(etcd, namespace) == {}
        assert await _loaded(client) == {}


async def test_reload_of_a_loaded_adapter_succeeds_without_work(
    lora_worker, etcd, namespace, adapters
):
    worker = lora_worker()
    async with httpx.AsyncClient(base_url=worker.url) as client:
        body = _load_body("pirate", adapters["pirate"])
        assert (await client.post("/engine/update/load_lora", json=body)).status_code == 200
        again = await client.post("/engine/update/load_lora", json=body)
        assert again.status_code == 200 and "already loaded" in again.json()["message"]
        other = await client.post(
            "/engine/update/load_lora", json=_load_body("pirate", adapters["robot"])
        )
        assert other.status_code == 409 and "unload it before" in other.json()["message"]
        await assert_invariant(client, etcd, namespace)


async def test_compat_routes_load_list_and_delete_names_with_slashes(
    lora_worker, etcd, namespace, adapters
):
    worker = lora_worker()
    async with httpx.AsyncClient(base_url=worker.url) as client:
        response = await client.post("/v1/loras", json=_load_body("org/chef", adapters["org/chef"]))
        assert response.status_code == 200, response.text
        listed = (await client.get("/v1/loras")).json()
        assert listed == {
            "status": "success",
            "loras": {"org/chef": lora_id("org/chef", DIGEST)},
            "count": 1,
            "digests": {"org/chef": DIGEST},
        }
        assert (await client.delete("/v1/loras/org/chef")).status_code == 200
        missing = await client.delete("/v1/loras/org/chef")
        assert missing.status_code == 404 and "is not loaded" in missing.json()["message"]
        assert await _cards(etcd, namespace) == {}


async def test_lora_routes_say_what_is_missing_when_lora_is_off(worker_factory):
    worker = worker_factory("--enable-lora")  # flag given, DYN_LORA_ENABLED not set
    async with httpx.AsyncClient(base_url=worker.url) as client:
        response = await client.post("/engine/update/load_lora", json={})
        assert response.status_code == 404
        assert response.json()["message"] == (
            "LoRA management not available: DYN_LORA_ENABLED is not true"
        )
        assert (await client.get("/v1/loras")).status_code == 404  # compat routes not mounted
    worker = worker_factory(env=LORA_ENV)  # env set, no --enable-lora
    async with httpx.AsyncClient(base_url=worker.url) as client:
        response = await client.get("/v1/loras")
        assert response.status_code == 404
        assert "without --enable-lora" in response.json()["message"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "lora_name"),
        ({"lora_name": 3, "source": {"uri": "file:///x"}}, "Expected `str`"),
        ({"lora_name": "x"}, "source"),
        ({"lora_name": "x", "source": "file:///x"}, "source"),
        ({"lora_name": "", "source": {"uri": "file:///x"}}, "non-empty"),
        ({"lora_name": "../etc", "source": {"uri": "file:///x"}}, "not safe"),
        ({"lora_name": "a\\b", "source": {"uri": "file:///x"}}, "not safe"),
        ({"lora_name": "demo", "source": {"uri": "file:///x"}}, "base model"),
        ({"lora_name": "x", "source": {"uri": "ftp://host/x"}}, "unsupported scheme 'ftp'"),
        ({"lora_name": "x", "source": {"uri": "no-scheme"}}, "not a URI"),
    ],
)
async def test_load_rejects_bad_input_with_400(lora_worker, body, says):
    worker = lora_worker()
    async with httpx.AsyncClient(base_url=worker.url) as client:
        for path in ("/engine/update/load_lora", "/v1/loras"):
            response = await client.post(path, json=body)
            assert response.status_code == 400, (path, response.text)
            assert says in response.json()["message"]


async def test_missing_adapter_directory_is_a_clear_4xx(lora_worker, tmp_path):
    worker = lora_worker()
    async with httpx.AsyncClient(base_url=worker.url) as client:
        uri = f"file://{tmp_path}/nowhere"
        response = await client.post("/engine/update/load_lora", json=_load_body("ghost", uri))
        assert 400 <= response.status_code < 500
        assert "nowhere" in response.json()["message"]
        assert response.json()["lora_name"] == "ghost"


async def test_weights_linked_from_outside_the_file_roots_are_a_clear_400(lora_worker, tmp_path):
    roots = tmp_path / "allowed"
    adapter = make_adapter_dir(roots, "pirate")
    secret = tmp_path / "private" / "weights.bin"
    secret.parent.mkdir()
    secret.write_bytes(b"\x01" * 64)
    (adapter / "adapter_model.safetensors").unlink()
    (adapter / "adapter_model.safetensors").symlink_to(secret)
    worker = lora_worker(env={"DYN_LORA_FILE_ROOTS": str(roots)})
    async with httpx.AsyncClient(base_url=worker.url) as client:
        body = _load_body("pirate", f"file://{adapter}")
        response = await client.post("/engine/update/load_lora", json=body)
        assert response.status_code == 400, response.text
        answer = response.json()
        assert answer["lora_name"] == "pirate"
        message = answer["message"]
        assert "adapter_model.safetensors is a symbolic link that leads outside" in message
        assert "private" not in message
        assert await _loaded(client) == {}


async def test_mutating_routes_need_the_bearer_token(lora_worker, adapters):
    worker = lora_worker(env={"DYN_SYSTEM_AUTH_TOKEN": "s3cret"})
    body = _load_body("pirate", adapters["pirate"])
    async with httpx.AsyncClient(base_url=worker.url) as client:
        assert (await client.post("/engine/update/load_lora", json=body)).status_code == 401
        assert (await client.post("/v1/loras", json=body)).status_code == 401
        assert (await client.delete("/v1/loras/pirate")).status_code == 401
        assert (await client.get("/v1/loras")).status_code == 200  # reads stay open
        headers = {"Authorization": "Bearer s3cret"}
        ok = await client.post("/engine/update/load_lora", json=body, headers=headers)
        assert ok.status_code == 200


async def test_full_slots_evict_the_least_recently_used_adapter(
    lora_worker, etcd, namespace, adapters
):
    worker = lora_worker("--max-loras", "2")
    async with httpx.AsyncClient(base_url=worker.url) as client:
        for name in ("a0", "a1", "a2"):
            response = await client.post(
                "/engine/update/load_lora", json=_load_body(name, adapters[name])
            )
            assert response.status_code == 200, response.text
        assert set(await _loaded(client)) == {"a1", "a2"}
        await assert_invariant(client, etcd, namespace)


async def test_capacity_error_when_every_slot_is_busy(lora_worker, etcd, nc, namespace, adapters):
    worker = lora_worker("--max-loras", "2", "--mocker-time-per-token-s", "0.05")
    (instance_kv,) = list(await etcd.get_prefix(f"v1/instances/{namespace}/".encode()))
    subject = decode_instance(instance_kv.value).subject
    async with httpx.AsyncClient(base_url=worker.url) as client:
        for name in ("a0", "a1"):
            await client.post("/engine/update/load_lora", json=_load_body(name, adapters[name]))
        started = {name: asyncio.Event() for name in ("a0", "a1")}
        busy = [
            asyncio.create_task(stream(nc, subject, _long_request(name), on_chunk=event.set))
            for name, event in started.items()
        ]
        await asyncio.gather(*(event.wait() for event in started.values()))  # both streaming
        full = await client.post("/engine/update/load_lora", json=_load_body("a2", adapters["a2"]))
        assert full.status_code == 429 and "pinned or busy" in full.json()["message"]
        for chunks in await asyncio.gather(*busy):
            assert isinstance(chunks[-1], FinalChunk)  # the busy adapters kept serving
        await assert_invariant(client, etcd, namespace)


def _long_request(model: str) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"busy-{model}", model=model, sampling=SamplingParams(max_tokens=20)
    )


async def test_engine_failing_to_add_publishes_nothing(lora_worker, etcd, namespace, adapters):
    worker = lora_worker("--engine-option", "fail_add_adapter=broken.*")
    async with httpx.AsyncClient(base_url=worker.url) as client:
        response = await client.post(
            "/engine/update/load_lora", json=_load_body("broken1", adapters["broken1"])
        )
        assert response.status_code == 502 and "broken1" in response.json()["message"]
        assert await _cards(etcd, namespace) == {} and await _loaded(client) == {}


async def test_engine_failing_to_remove_keeps_the_card(lora_worker, etcd, namespace, adapters):
    worker = lora_worker("--engine-option", "fail_remove_adapter=pirate")
    async with httpx.AsyncClient(base_url=worker.url) as client:
        await client.post("/engine/update/load_lora", json=_load_body("pirate", adapters["pirate"]))
        response = await client.post("/engine/update/unload_lora", json={"lora_name": "pirate"})
        assert response.status_code == 502
        assert await _cards(etcd, namespace) == {"pirate": lora_id("pirate", DIGEST)}
        await assert_invariant(client, etcd, namespace)


@pytest.fixture
async def etcd_proxy(etcd_url: str):
    proxy = await TcpProxy(int(etcd_url.rsplit(":", 1)[1])).start()
    yield proxy
    await proxy.aclose()


async def test_etcd_unreachable_during_load_rolls_back(
    lora_worker, etcd, etcd_proxy, namespace, adapters
):
    # Started in a thread: the proxy lives on this event loop, which must keep running.
    worker = await asyncio.to_thread(lora_worker, env={"ETCD_ENDPOINTS": etcd_proxy.url})
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:
        etcd_proxy.cut()
        response = await client.post(
            "/engine/update/load_lora", json=_load_body("pirate", adapters["pirate"])
        )
        assert response.status_code == 503 and "etcd" in response.json()["message"]
        assert await _loaded(client) == {}
        etcd_proxy.restore()
        await assert_invariant(client, etcd, namespace)
        assert await _cards(etcd, namespace) == {}


async def test_etcd_unreachable_during_unload_keeps_adapter_and_card(
    lora_worker, etcd, etcd_proxy, namespace, adapters
):
    # Started in a thread: the proxy lives on this event loop, which must keep running.
    worker = await asyncio.to_thread(lora_worker, env={"ETCD_ENDPOINTS": etcd_proxy.url})
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:
        await client.post("/engine/update/load_lora", json=_load_body("pirate", adapters["pirate"]))
        etcd_proxy.cut()
        response = await client.post("/engine/update/unload_lora", json={"lora_name": "pirate"})
        assert response.status_code == 503
        assert await _loaded(client) == {"pirate": lora_id("pirate", DIGEST)}
        etcd_proxy.restore()
        await assert_invariant(client, etcd, namespace)
        assert await _cards(etcd, namespace) == {"pirate": lora_id("pirate", DIGEST)}


def _storm_plan(seed: int) -> list[tuple[str, str]]:
    """The storm's 100 calls, drawn up front: 50 on one name, then 50 on mixed names.

    The same seed gives the same calls in the same order; a failure names its seed
    in the test id, so ``-k "storm and 7"`` replays it."""
    rng = random.Random(seed)
    names = ["pirate", "a0", "a1", "a2"]
    targets = ["pirate"] * 50 + [rng.choice(names) for _ in range(50)]
    return [("load_lora" if rng.random() < 0.5 else "unload_lora", name) for name in targets]


def test_storm_plan_is_replayable_from_its_seed():
    assert _storm_plan(SEED) == _storm_plan(SEED)
    assert _storm_plan(SEED) != _storm_plan(SEED + 1)


@pytest.mark.parametrize("seed", [SEED])
async def test_storm_of_concurrent_loads_and_unloads_keeps_the_invariant(
    lora_worker, etcd, namespace, adapters, seed
):
    worker = lora_worker("--engine-option", "add_adapter_delay_s=0.01")
    plan = _storm_plan(seed)
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:

        async def call(route: str, name: str) -> int:
            body = _load_body(name, adapters[name]) if route == "load_lora" else {"lora_name": name}
            return (await client.post(f"/engine/update/{route}", json=body)).status_code

        same_name = await asyncio.gather(*(call(*step) for step in plan[:50]))
        mixed = await asyncio.gather(*(call(*step) for step in plan[50:]))
        assert set(same_name + mixed) <= {200, 404}, f"seed {seed}"
        await assert_invariant(client, etcd, namespace)


async def test_updates_over_nats_reach_the_same_lifecycle(
    lora_worker, etcd, nats_url, namespace, adapters
):
    worker = lora_worker()
    (instance_kv,) = list(await etcd.get_prefix(f"v1/instances/{namespace}/".encode()))
    subject = decode_instance(instance_kv.value).subject
    nc = await nats.connect(nats_url)
    try:
        load = UpdateRequest(name="update/load_lora", body=_load_body("robot", adapters["robot"]))
        reply = await nc.request(subject, encode_msg(load), timeout=10)
        answer = msgspec.msgpack.decode(reply.data, type=UpdateReply)
        assert answer.status_code == 200 and answer.body["lora_name"] == "robot"
    finally:
        await nc.close()
    async with httpx.AsyncClient(base_url=worker.url) as client:
        assert await _loaded(client) == {"robot": lora_id("robot", DIGEST)}
        await assert_invariant(client, etcd, namespace)


async def test_sigkill_with_adapters_loaded_removes_all_cards_within_ttl(
    lora_worker, etcd, namespace, adapters
):
    worker = lora_worker()
    async with httpx.AsyncClient(base_url=worker.url) as client:
        for name in ("pirate", "robot"):
            await client.post("/engine/update/load_lora", json=_load_body(name, adapters[name]))
    assert len(await _cards(etcd, namespace)) == 2
    worker.kill()
    async with asyncio.timeout(2 + 1):
        while await etcd.get_prefix(f"v1/mdc/{namespace}/".encode()):
            await asyncio.sleep(0.05)


async def test_etcd_unreachable_during_a_swap_keeps_the_old_version_and_its_card(
    lora_worker, etcd, etcd_proxy, namespace, adapters, tmp_path
):
    """The publish step of a swap fails: the new version leaves the engine again, and the
    old one keeps serving under its card."""
    new = make_adapter_dir(tmp_path / "v2", "pirate", weights=b"\x02" * 16)
    worker = await asyncio.to_thread(lora_worker, env={"ETCD_ENDPOINTS": etcd_proxy.url})
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:
        body = _load_body("pirate", adapters["pirate"])
        assert (await client.post("/engine/update/load_lora", json=body)).status_code == 200
        etcd_proxy.cut()
        swap = {**_load_body("pirate", f"file://{new}"), "replace": True}
        response = await client.post("/engine/update/load_lora", json=swap)
        assert response.status_code == 503, response.text
        answer = response.json()
        assert answer["step"] == "publish" and f"{DIGEST} keeps serving" in answer["message"]
        assert await _held(client) == {"pirate": (lora_id("pirate", DIGEST), DIGEST)}
        etcd_proxy.restore()
        await assert_invariant(client, etcd, namespace)
        assert await _versions(etcd, namespace) == {"pirate": (lora_id("pirate", DIGEST), DIGEST)}
