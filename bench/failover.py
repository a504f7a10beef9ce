"""``python -m bench.failover``: how fast a killed worker is noticed, and what clients see.

Two mocker workers serve ``demo``; the second also serves an adapter of its
own. While closed-loop clients send chat requests (non-streaming and
streaming) through the frontend, the second worker is SIGKILLed. Each round
times SIGKILL until its adapter leaves ``/v1/models`` and until ``/health``
counts one instance, and counts the requests that failed meanwhile. Streams
are cut by the kill: they must migrate to the survivor and still read exactly
the unmigrated answer, with the whole answer's usage. ``--engine hf`` runs the
demo model (greedy streams) instead of the mocker.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from bench._adapters import FrontendModels, admin
from bench._cluster import BenchCluster, Service
from bench._failover_engines import ENGINES, FailoverEngine, failover_engine
from bench._http import http_get_json
from bench._load import Outcome, Session, closed_loop
from bench._report import (
    add_output_flags,
    benchmark_main,
    machine,
    ms,
    percentile,
    table,
)
from bench._streams import (
    Answer,
    StreamChecks,
    checked_stream_session,
    migrations,
    unmigrated_answer,
)
from bench.serve import http_session

__all__ = ["build_parser", "main", "run"]

MODEL: Final = "demo"
OWN_ADAPTER: Final = "only-on-victim"
SETTLE_S: Final = 0.5
"""Load runs this long before the kill, and this long after the worker is gone."""
GONE_TIMEOUT_S: Final = 60.0


@dataclass
class _Traffic:
    """Requests finished during a round: (finish time, ok, latency) per kind."""

    done: dict[str, list[tuple[float, bool, float]]] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def loop(self, kind: str, open_call: Session) -> None:
        """One closed-loop client until ``stop``; reconnects after a failed connection."""
        log = self.done.setdefault(kind, [])

        def record(outcome: Outcome, started: float, ended: float) -> None:
            log.append((ended, outcome.ok, ended - started))

        await closed_loop(open_call, lambda: not self.stop.is_set(), record)


async def _wait(
    condition: Callable[[], Awaitable[bool]], timeout_s: float = GONE_TIMEOUT_S
) -> float:
    """Poll ``condition()`` (async) until true; returns when it became true (perf_counter)."""
    deadline = time.perf_counter() + timeout_s
    while not await condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("the frontend never showed the change")
        await asyncio.sleep(0.005)
    return time.perf_counter()


async def _instances(frontend: Service) -> int:
    _status, body, _size = await http_get_json("127.0.0.1", frontend.port, "/health")
    return int(body["instances"])  # type: ignore[index]


async def _start_victim(
    cluster: BenchCluster, models: FrontendModels, frontend: Service, setup: FailoverEngine
) -> Service:
    victim = cluster.worker(setup.model, "--enable-lora", *setup.worker_args, engine=setup.engine)
    body = {"lora_name": OWN_ADAPTER, "source": {"uri": setup.adapter_uri}}
    status = await admin(victim, "load_lora", body)
    if status != 200:
        raise RuntimeError(f"load_lora on the victim answered HTTP {status}")
    needle = f'"id":"{OWN_ADAPTER}"'.encode()

    async def ready() -> bool:
        return needle in await models.models() and await _instances(frontend) == 2

    await _wait(ready)
    return victim


@dataclass(frozen=True, kw_only=True)
class _Fleet:
    """What every round uses: the cluster, its frontend, the engine and the reference answer."""

    cluster: BenchCluster
    frontend: Service
    models: FrontendModels
    setup: FailoverEngine
    expected: Answer


async def _round(fleet: _Fleet, args: argparse.Namespace) -> dict[str, Any]:
    cluster, frontend, models = fleet.cluster, fleet.frontend, fleet.models
    victim = await _start_victim(cluster, models, frontend, fleet.setup)
    traffic, checks = _Traffic(), StreamChecks()
    migrated_before = await migrations(frontend.port)
    stream = checked_stream_session(frontend.port, fleet.setup.stream_body, fleet.expected, checks)
    sessions = {"whole": http_session(frontend.port, stream=False), "stream": stream}
    tasks = [asyncio.create_task(traffic.loop("whole", sessions["whole"]))
             for _ in range(args.concurrency)]  # fmt: skip
    tasks += [asyncio.create_task(traffic.loop("stream", sessions["stream"]))
              for _ in range(args.stream_concurrency)]  # fmt: skip
    await asyncio.sleep(SETTLE_S)
    killed_at = time.perf_counter()
    victim.stop(kill=True)
    needle = f'"id":"{OWN_ADAPTER}"'.encode()

    async def adapter_gone() -> bool:
        return needle not in await models.models()

    async def one_instance() -> bool:
        return await _instances(frontend) == 1

    gone_at = await _wait(adapter_gone)
    counted_at = await _wait(one_instance)
    await asyncio.sleep(SETTLE_S)
    traffic.stop.set()
    await asyncio.gather(*tasks)
    cluster.services.remove(victim)
    figures = _round_figures(traffic, killed_at, gone_at, counted_at)
    figures["stream_checks"] = checks.figures()
    figures["migrations"] = round(await migrations(frontend.port) - migrated_before)
    return figures


def _round_figures(
    traffic: _Traffic, killed_at: float, gone_at: float, counted_at: float
) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "models_gone_s": round(gone_at - killed_at, 3),
        "health_one_instance_s": round(counted_at - killed_at, 3),
    }
    for kind, done in traffic.done.items():
        after_kill = [(ok, latency) for end, ok, latency in done if end >= killed_at]
        figures[kind] = {
            "requests": len(done),
            "failed": sum(1 for _end, ok, _latency in done if not ok),
            "requests_after_kill": len(after_kill),
            "max_latency_after_kill_ms": ms(max((lat for _ok, lat in after_kill), default=None)),
            "p50_latency_ms": ms(percentile([lat for _end, _ok, lat in done], 0.5)),
        }
    return figures


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start a frontend and a survivor worker, then kill a victim worker ``--rounds`` times."""
    with BenchCluster(lease_ttl_s=args.lease_ttl_s) as cluster:
        setup = failover_engine(args, cluster, MODEL, OWN_ADAPTER)
        cluster.worker(setup.model, *setup.worker_args, engine=setup.engine)
        frontend = cluster.frontend()
        expected = await unmigrated_answer(frontend.port, setup.stream_body)  # one worker yet
        fleet = _Fleet(cluster=cluster, frontend=frontend, models=FrontendModels(frontend),
                       setup=setup, expected=expected)  # fmt: skip
        rounds = [await _round(fleet, args) for _ in range(args.rounds)]
    return {
        "bench": "failover",
        "machine": machine(),
        "settings": {"engine": args.engine, "rounds": args.rounds, "lease_ttl_s": args.lease_ttl_s,
                     "concurrency": args.concurrency, "stream_concurrency": args.stream_concurrency,
                     "stream_max_tokens": args.stream_max_tokens,
                     "mocker_time_per_token_s": args.time_per_token_s},
        "results": _summary(rounds),
        "rounds": rounds,
    }  # fmt: skip


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    gone = [r["models_gone_s"] for r in rounds]
    counted = [r["health_one_instance_s"] for r in rounds]
    return {
        "models_gone_p50_s": percentile(gone, 0.5),
        "models_gone_max_s": max(gone),
        "health_one_instance_p50_s": percentile(counted, 0.5),
        "failed_whole": sum(r["whole"]["failed"] for r in rounds if "whole" in r),
        "requests_whole": sum(r["whole"]["requests"] for r in rounds if "whole" in r),
        "failed_stream": sum(r["stream"]["failed"] for r in rounds if "stream" in r),
        "requests_stream": sum(r["stream"]["requests"] for r in rounds if "stream" in r),
        "kills": len(rounds),
        "migrations": sum(r["migrations"] for r in rounds),
        "streams_text_differs": sum(r["stream_checks"]["text_differs"] for r in rounds),
        "streams_usage_differs": sum(r["stream_checks"]["usage_differs"] for r in rounds),
    }


def _text(results: dict[str, Any], rounds: list[dict[str, Any]], ttl_s: int) -> str:
    headers = ["round", "gone s", "health s", "whole failed/total", "whole max ms after kill",
               "stream failed/total", "migrations"]  # fmt: skip
    rows = [
        [index + 1, r["models_gone_s"], r["health_one_instance_s"],
         f"{r['whole']['failed']}/{r['whole']['requests']}" if "whole" in r else "-",
         r["whole"]["max_latency_after_kill_ms"] if "whole" in r else None,
         f"{r['stream']['failed']}/{r['stream']['requests']}" if "stream" in r else "-",
         r["migrations"]]
        for index, r in enumerate(rounds)
    ]  # fmt: skip
    totals = (f"{results['kills']} kills, {results['requests_stream']} streams, "
              f"{results['migrations']} migrated, {results['failed_stream']} failed, "
              f"{results['streams_text_differs']} with other text, "
              f"{results['streams_usage_differs']} with other usage")  # fmt: skip
    return f"lease TTL {ttl_s} s\n" + table(headers, rows) + "\n" + totals


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", choices=ENGINES, default="mocker",
                        help="mocker, or hf on the demo model (greedy streams)")  # fmt: skip
    parser.add_argument("--lease-ttl-s", type=int, default=3, help="workers' DYN_LEASE_TTL")
    parser.add_argument("--concurrency", type=int, default=8, help="non-streaming clients")
    parser.add_argument("--stream-concurrency", type=int, default=8, help="streaming clients")
    parser.add_argument("--stream-max-tokens", type=int, default=32,
                        help="mocker tokens per stream (so a kill cuts some)")  # fmt: skip
    parser.add_argument("--time-per-token-s", type=float, default=0.002, help="mocker speed")
    add_output_flags(parser)
    return parser


def _table(results: dict[str, Any], args: argparse.Namespace) -> str:
    return _text(results["results"], results["rounds"], args.lease_ttl_s)


main: Final = benchmark_main(build_parser, run, _table)


if __name__ == "__main__":
    sys.exit(main())
