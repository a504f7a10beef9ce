"""``python -m bench.rollout``: a bad canary rolled back, and a version switch under load.

Mocker workers serve ``bot-v1``, ``bot-v2`` and ``bot-bad`` (the mocker fails
``--bad-share`` of ``bot-bad``'s requests: its ``fail_generate`` fault injection) behind
``--frontends`` frontends, with ``--concurrency`` clients looping on the alias ``bot``.

- canary: ``bot-bad`` at 10% under a policy; figures: windows until the rollback, the
  requests the bad version failed before it, and that bound (the canary's share of one
  window's traffic).
- switch: all of ``bot`` moved from ``bot-v1`` to ``bot-v2`` in one alias write, under
  load; figures: requests failed, and the time from the write until every answer comes
  from ``bot-v2``. This measures the alias shift v1 -> v2.
- swap (``--swap-engines``, in a fleet of its own per engine): one adapter's weights
  replaced in place on a worker (``replace: true``, vLLM's ``load_inplace``) under load;
  figures: requests failed, time from the swap call until only the new version answers,
  the old version's drain, and the worker's resident memory before, during and after
  (``bench/_inplace_swap.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from bench._cluster import BenchCluster, Service
from bench._inplace_swap import swap_under_load
from bench._report import add_output_flags, benchmark_main, machine, table

__all__ = ["build_parser", "main", "run"]

MODEL: Final = "demo"
VERSIONS: Final = ("bot-v1", "bot-v2", "bot-bad")
READY_TIMEOUT_S: Final = 60.0
RUN_TIMEOUT_S: Final = 300.0


@dataclass
class Traffic:
    """Every answer the clients got: when it started and ended, and which version or error."""

    answers: list[tuple[float, float, str]] = field(default_factory=list)
    """(start, end, model) of each 200."""
    failures: list[tuple[float, float, int]] = field(default_factory=list)
    """(start, end, status) of each error."""


async def _loop(http: httpx.AsyncClient, url: str, traffic: Traffic, stop: asyncio.Event) -> None:
    """One client: no session, so each request is split at random by the weights."""
    body = {"model": "bot", "prompt": "hi", "max_tokens": 2}
    while not stop.is_set():
        started = time.monotonic()
        response = await http.post(f"{url}/v1/completions", json=body)
        ended = time.monotonic()
        if response.status_code == 200:
            traffic.answers.append((started, ended, response.json()["model"]))
        else:
            traffic.failures.append((started, ended, response.status_code))


async def _load(
    frontends: list[Service], concurrency: int, until: Callable[[], Any]
) -> tuple[Traffic, float]:
    """Run the clients over every frontend until ``until`` returns; traffic and its start."""
    traffic, stop = Traffic(), asyncio.Event()
    urls = itertools.cycle(f.url for f in frontends)
    async with httpx.AsyncClient(timeout=30) as http:
        clients = [
            asyncio.create_task(_loop(http, next(urls), traffic, stop)) for i in range(concurrency)
        ]
        began = time.monotonic()
        try:
            await until()
        finally:
            stop.set()
            await asyncio.gather(*clients)
    return traffic, began


async def _admin(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(f"{url}{path}", json=body)
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


async def _canary(frontends: list[Service], args: argparse.Namespace) -> dict[str, Any]:
    url = frontends[0].url
    await _admin(
        url, "/v1/aliases", {"name": "bot", "targets": [{"model": "bot-v1", "weight": 100}]}
    )
    policy = {
        "max_error_rate": args.max_error_rate,
        "min_requests": args.min_requests,
        "window_s": args.window_s,
    }
    record: dict[str, Any] = {}

    async def until_judged() -> None:
        nonlocal record
        await _admin(
            url,
            "/v1/rollouts",
            {"alias": "bot", "canary": "bot-bad", "weight": 10, "policy": policy},
        )
        async with httpx.AsyncClient(timeout=10) as http:
            while True:
                record = (await http.get(f"{url}/v1/aliases/bot")).json()
                if record["rollout"]["phase"] != "running":
                    return
                await asyncio.sleep(0.05)

    traffic, began = await _load(frontends, args.concurrency, until_judged)
    elapsed = max(end for _s, end, _m in traffic.answers) - began
    per_window = (len(traffic.answers) + len(traffic.failures)) / elapsed * args.window_s
    rollout = record["rollout"]
    return {
        "phase": rollout["phase"],
        "reason": rollout["reason"],
        "windows_until_rollback": rollout["windows"],
        "seconds_until_rollback": round(elapsed, 2),
        "bad_requests_failed": len(traffic.failures),
        "bad_requests_answered": sum(1 for *_t, model in traffic.answers if model == "bot-bad"),
        "requests": len(traffic.answers) + len(traffic.failures),
        "bound_one_window_canary_share": round(0.1 * per_window, 1),
        "last_window": rollout["figures"],
    }


async def _switch(frontends: list[Service], args: argparse.Namespace) -> dict[str, Any]:
    url = frontends[0].url
    to_v1 = {"name": "bot", "targets": [{"model": "bot-v1", "weight": 100}]}
    await _admin(url, "/v1/aliases", to_v1)
    switched_at = 0.0

    async def switch() -> None:
        nonlocal switched_at
        await asyncio.sleep(args.switch_after_s)
        switched_at = time.monotonic()
        await _admin(url, "/v1/aliases", {**to_v1, "targets": [{"model": "bot-v2", "weight": 100}]})
        await asyncio.sleep(args.switch_after_s)

    traffic, _began = await _load(frontends, args.concurrency, switch)
    old = [(start, end) for start, end, model in traffic.answers if model == "bot-v1"]
    last_start = max((start for start, _end in old), default=switched_at)
    last_end = max((end for _start, end in old), default=switched_at)
    others = [m for *_times, m in traffic.answers if m not in ("bot-v1", "bot-v2")]
    return {
        "requests": len(traffic.answers) + len(traffic.failures),
        "failed": len(traffic.failures),
        "new_requests_only_new_after_ms": round(max(0.0, last_start - switched_at) * 1000, 1),
        "last_old_answer_after_ms": round(max(0.0, last_end - switched_at) * 1000, 1),
        "answers_neither_version": len(others),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Roll a bad canary back and switch an alias under load (unless ``--no-alias``), then
    swap an adapter in place on each of ``--swap-engines``."""
    results: dict[str, Any] = {}
    if not args.no_alias:
        results = await _aliases(args)
    results["swaps"] = [
        await swap_under_load(
            engine,
            concurrency=args.concurrency,
            settle_s=args.swap_settle_s,
            time_per_token_s=args.time_per_token_s,
        )
        for engine in args.swap_engines
    ]
    return {
        "bench": "rollout",
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "results": results,
    }


async def _aliases(args: argparse.Namespace) -> dict[str, Any]:
    with BenchCluster() as cluster:
        faults = (
            "--engine-option",
            "fail_generate=bot-bad",
            "--engine-option",
            f"fail_generate_share={args.bad_share}",
            "--engine-option",
            f"time_per_token_s={args.time_per_token_s}",
        )
        workers = [
            cluster.worker(MODEL, "--enable-lora", *faults, wait=False) for _ in range(args.workers)
        ]
        for worker in workers:
            cluster.await_worker(worker)
        frontends = [cluster.frontend() for _ in range(args.frontends)]
        await _declare(cluster, frontends[0].url)
        canary = await _canary(frontends, args)
        switch = await _switch(frontends, args)
    return {"canary": canary, "switch": switch}


async def _declare(cluster: BenchCluster, url: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        for name in VERSIONS:
            body = {
                "name": name,
                "base_model": MODEL,
                "source": {"uri": cluster.adapter(name)},
                "replicas": "all",
            }
            (await http.post(f"{url}/v1/adapters", json=body)).raise_for_status()
        async with asyncio.timeout(READY_TIMEOUT_S):
            while True:
                models = {
                    m["id"]
                    for m in (await http.get(f"{url}/v1/models")).json()["data"]
                    if m.get("loaded", True)
                }
                if set(VERSIONS) <= models:
                    return
                await asyncio.sleep(0.1)


def _text(results: dict[str, Any], _args: argparse.Namespace) -> str:
    swaps = table(
        ["in-place swap", "requests", "failed", "neither", "call ms", "only new after ms",
         "old drained ms", "RSS MB before", "peak", "after"],
        [[s["engine"], s["requests"], s["failed"], s["answers_neither_version"], s["swap_call_ms"],
          s["only_new_for_requests_started_after_ms"], s["old_version_drained_after_ms"],
          s["rss_mb_before"], s["rss_mb_peak_during_swap"], s["rss_mb_after"]]
         for s in results["results"]["swaps"]],
    )  # fmt: skip
    if "canary" not in results["results"]:
        return swaps
    canary, switch = results["results"]["canary"], results["results"]["switch"]
    first = table(
        ["bad canary at 10%", "phase", "windows", "seconds", "bad failed", "bound", "requests"],
        [
            [
                "bot-bad",
                canary["phase"],
                canary["windows_until_rollback"],
                canary["seconds_until_rollback"],
                canary["bad_requests_failed"],
                canary["bound_one_window_canary_share"],
                canary["requests"],
            ]
        ],
    )
    second = table(
        ["alias switch v1->v2", "requests", "failed", "new only after ms", "last old answer ms"],
        [
            [
                "bot",
                switch["requests"],
                switch["failed"],
                switch["new_requests_only_new_after_ms"],
                switch["last_old_answer_after_ms"],
            ]
        ],
    )
    return f"{first}\n\n{second}\n(the switch is an alias write)\n\n{swaps}"


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.rollout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workers", type=int, default=2, help="mocker workers")
    parser.add_argument("--frontends", type=int, default=2, help="frontends sharing the judging")
    parser.add_argument("--concurrency", type=int, default=16, help="client loops")
    parser.add_argument("--bad-share", type=float, default=0.3, help="share of bot-bad that fails")
    parser.add_argument("--window-s", type=float, default=2.0, help="the policy's window")
    parser.add_argument("--min-requests", type=int, default=20, help="canary requests per window")
    parser.add_argument("--max-error-rate", type=float, default=0.05, help="the policy's bound")
    parser.add_argument("--time-per-token-s", type=float, default=0.005, help="mocker speed")
    parser.add_argument(
        "--switch-after-s", type=float, default=2.0, help="load before and after the switch"
    )
    parser.add_argument("--no-alias", action="store_true", help="only the in-place swaps")
    parser.add_argument(
        "--swap-engines", type=lambda text: [e for e in text.split(",") if e], default=["mocker"],
        help="engines to swap an adapter in place on, comma-separated: mocker, hf ('' for none)",
    )  # fmt: skip
    parser.add_argument(
        "--swap-settle-s", type=float, default=2.0, help="load before and after the swap call"
    )
    add_output_flags(parser)
    return parser


main: Final = benchmark_main(build_parser, run, _text)


if __name__ == "__main__":
    sys.exit(main())
