"""Cold requests for ``bench.lora``: the first chat request for a desired adapter loaded nowhere.

The adapter is put in the desired state with ``replicas: 0`` (on demand only).
Each round unloads it where it is, waits until ``/v1/models`` lists it as
``loaded: false``, then times one chat request (the frontend loads it on
demand, then answers) and a second one (already loaded).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

import msgspec

from bench._adapters import admin
from bench._cluster import Service
from bench._http import http_once
from bench._report import ms, percentile

__all__ = ["cold_rounds"]

COLD_TIMEOUT_S: Final = 60.0
MAX_TOKENS: Final = 4


async def _model_entry(frontend: Service, name: str) -> dict[str, Any] | None:
    response = await http_once(frontend.port, "GET", f"/v1/models/{name}")
    return msgspec.json.decode(response.body) if response.status == 200 else None


async def _holders(frontend: Service, name: str) -> list[int]:
    response = await http_once(frontend.port, "GET", f"/v1/adapters/{name}")
    return [int(hex_id, 16) for hex_id in msgspec.json.decode(response.body)["instances"]]


async def _make_cold(frontend: Service, workers: list[Service], name: str) -> None:
    """Unload ``name`` wherever it is and wait until the frontend lists it as cold."""
    by_id = {worker.instance_id: worker for worker in workers}
    for instance_id in await _holders(frontend, name):
        await admin(by_id[instance_id], "unload_lora", {"lora_name": name})
    deadline = time.perf_counter() + COLD_TIMEOUT_S
    while (entry := await _model_entry(frontend, name)) is None or entry.get("loaded", True):
        if time.perf_counter() > deadline:
            raise TimeoutError(f"/v1/models never listed {name!r} as cold: {entry}")
        await asyncio.sleep(0.005)


async def _timed_chat(frontend: Service, name: str) -> float:
    body = {"model": name, "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": "Who are you?"}]}  # fmt: skip
    started = time.perf_counter()
    response = await http_once(frontend.port, "POST", "/v1/chat/completions", body)
    if response.status != 200:
        raise RuntimeError(f"chat with {name!r} answered HTTP {response.status}: {response.body!r}")
    return time.perf_counter() - started


async def cold_rounds(
    frontend: Service, workers: list[Service], *, name: str, uri: str, base: str, rounds: int
) -> dict[str, Any]:
    """Declare ``name`` on demand only, then time cold and warm requests ``rounds`` times."""
    spec = {"name": name, "base_model": base, "source": {"uri": uri}, "replicas": 0}
    declared = await http_once(frontend.port, "POST", "/v1/adapters", spec)
    if declared.status not in (200, 201):
        raise RuntimeError(f"POST /v1/adapters answered HTTP {declared.status}: {declared.body!r}")
    cold: list[float] = []
    warm: list[float] = []
    for index in range(rounds + 1):  # the first round is untimed
        await _make_cold(frontend, workers, name)
        cold_s, warm_s = await _timed_chat(frontend, name), await _timed_chat(frontend, name)
        if index:
            cold.append(cold_s)
            warm.append(warm_s)
    holders = await _holders(frontend, name)
    await http_once(frontend.port, "DELETE", f"/v1/adapters/{name}")
    by_id = {worker.instance_id: worker for worker in workers}
    for instance_id in holders:
        await admin(by_id[instance_id], "unload_lora", {"lora_name": name})
    return {
        "rounds": rounds,
        "cold_p50_ms": ms(percentile(cold, 0.5)),
        "cold_max_ms": ms(max(cold, default=None)),
        "warm_p50_ms": ms(percentile(warm, 0.5)),
        "on_demand_cost_p50_ms": ms(
            percentile([c - w for c, w in zip(cold, warm, strict=True)], 0.5)
        ),
    }
