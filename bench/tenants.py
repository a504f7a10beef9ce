"""``python -m bench.tenants``: can one tenant's flood hurt the others, and what keys cost.

One frontend and mocker workers serve ``demo``. Three tenants send streamed chat
requests in open loops at ``--rate`` req/s each, in three phases of ``--duration-s``:

- ``open``: no tenants or keys (the routes are open);
- ``keys``: each tenant has a key and ``requests_per_s = --quota``;
- ``flood``: the same, but tenant ``c`` sends at 10x its quota;
- ``saturated``: a fresh frontend with ``--fleet-max-inflight --slots``; the tenants have no
  rate limit, ``a`` and ``b`` priority 9 and ``c`` priority 0, and ``c`` sends at 10x the
  quota again: the fleet is saturated, and admission sheds by priority.

Figures: the well-behaved tenants' (``a``, ``b``) TTFT p50/p99 and errors per phase, the
flooder's 429 share, and the frontend's CPU milliseconds per request (open vs keys).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, Final

import httpx

from bench._cluster import BenchCluster, Service
from bench._http import build_request
from bench._open_loop import Planned, Sample, run_open_loop
from bench._report import (
    CpuMeter,
    add_output_flags,
    benchmark_main,
    machine,
    ms,
    percentile,
    table,
)

__all__ = ["build_parser", "main", "run"]

MODEL: Final = "demo"
TENANTS: Final = ("a", "b", "c")
FLOODER: Final = "c"
FLOOD_FACTOR: Final = 10
READY_TIMEOUT_S: Final = 60.0


def _plan(port: int, key: str, count: int, max_tokens: int) -> list[Planned]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens, "stream": True}  # fmt: skip
    raw = build_request("POST", "127.0.0.1", port, "/v1/chat/completions", body, bearer=key)
    return [Planned(0, raw)] * count


async def _phase(
    frontend: Service, keys: dict[str, str], rates: dict[str, float], args: argparse.Namespace
) -> dict[str, Any]:
    """Every tenant's open loop at its rate for ``--duration-s``; figures per tenant."""
    meter = CpuMeter({"frontend": [frontend.pid]})
    meter.start()
    loops = []
    for name in TENANTS:
        count = int(rates[name] * args.duration_s)
        plan = _plan(frontend.port, keys.get(name, ""), count, args.max_tokens)
        loops.append(run_open_loop(frontend.port, plan, rate_per_s=rates[name], timeout_s=30))
    results: list[list[Sample]] = list(await asyncio.gather(*loops))
    cpu_s = meter.stop()["frontend"]
    requests = sum(len(samples) for samples in results)
    return {
        "frontend_cpu_ms_per_request": round(cpu_s * 1000 / max(1, requests), 3),
        "tenants": {name: _figures(got) for name, got in zip(TENANTS, results, strict=True)},
    }


def _figures(samples: list[Sample]) -> dict[str, Any]:
    ttfts = [s.ttft_s for s in samples if s.ok and s.ttft_s is not None]
    refused = sum(1 for s in samples if s.failure.startswith("HTTP 429"))
    return {
        "requests": len(samples),
        "ttft_p50_ms": ms(percentile(ttfts, 0.5)),
        "ttft_p99_ms": ms(percentile(ttfts, 0.99)),
        "errors": sum(1 for s in samples if not s.ok) - refused,
        "refused_429": refused,
        "share_429": round(refused / max(1, len(samples)), 3),
    }


async def _make_tenants(url: str, quota: float) -> dict[str, str]:
    """Each tenant with ``requests_per_s = quota`` and one key; the keys by tenant."""
    keys = {}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:  # no admin token set
        for name in TENANTS:
            tenant = {"name": name, "models": [MODEL], "requests_per_s": quota}
            (await http.post("/v1/tenants", json=tenant)).raise_for_status()
            answer = await http.post("/v1/keys", json={"tenant": name})
            answer.raise_for_status()
            keys[name] = answer.json()["key"]
    return keys


async def _prioritise(url: str) -> None:
    """Lift the tenants' rate limits; the flooder gets priority 0, the others 9."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for name in TENANTS:
            tenant = {"name": name, "models": [MODEL], "priority": 0 if name == FLOODER else 9}
            (await http.post("/v1/tenants", json=tenant)).raise_for_status()


async def _ready(url: str, key: str = "") -> None:
    """Wait until the frontend lists the model (to ``key``'s tenant once keys exist)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(timeout=10, headers=headers) as http:
        async with asyncio.timeout(READY_TIMEOUT_S):
            while not (await http.get(f"{url}/v1/models")).json()["data"]:
                await asyncio.sleep(0.1)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the fleet, then run the three phases."""
    with BenchCluster() as cluster:
        speed = ("--engine-option", f"time_per_token_s={args.time_per_token_s}")
        workers = [cluster.worker(MODEL, *speed, wait=False) for _ in range(args.workers)]
        for worker in workers:
            cluster.await_worker(worker)
        frontend = cluster.frontend()
        await _ready(frontend.url)
        even = dict.fromkeys(TENANTS, args.rate)
        phases = {"open": await _phase(frontend, {}, even, args)}
        keys = await _make_tenants(frontend.url, args.quota)
        phases["keys"] = await _phase(frontend, keys, even, args)
        flood = {**even, FLOODER: args.quota * FLOOD_FACTOR}
        phases["flood"] = await _phase(frontend, keys, flood, args)
        await asyncio.to_thread(frontend.stop)  # its presence goes: the next holds every slot
        saturated = cluster.frontend("--fleet-max-inflight", str(args.slots))
        await _ready(saturated.url, keys[FLOODER])
        await _prioritise(saturated.url)
        phases["saturated"] = await _phase(saturated, keys, flood, args)
    return {
        "bench": "tenants",
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "results": phases,
    }


def _text(results: dict[str, Any], _args: argparse.Namespace) -> str:
    rows = []
    for phase, figures in results["results"].items():
        for name, tenant in figures["tenants"].items():
            rows.append([phase, name, tenant["requests"], tenant["ttft_p50_ms"],
                         tenant["ttft_p99_ms"], tenant["errors"], tenant["share_429"],
                         figures["frontend_cpu_ms_per_request"]])  # fmt: skip
    headers = ["phase", "tenant", "requests", "ttft p50 ms", "ttft p99 ms", "errors",
               "429 share", "frontend cpu ms/req"]  # fmt: skip
    return table(headers, rows)


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.tenants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workers", type=int, default=1, help="mocker workers")
    parser.add_argument("--rate", type=float, default=5.0, help="req/s of each tenant")
    parser.add_argument("--quota", type=float, default=10.0, help="each tenant's requests_per_s")
    parser.add_argument("--duration-s", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per answer")
    parser.add_argument("--time-per-token-s", type=float, default=0.005, help="mocker speed")
    parser.add_argument("--slots", type=int, default=2,
                        help="the saturated phase's --fleet-max-inflight")  # fmt: skip
    add_output_flags(parser)
    return parser


main: Final = benchmark_main(build_parser, run, _text)


if __name__ == "__main__":
    sys.exit(main())
