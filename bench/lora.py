"""``python -m bench.lora``: how fast adapters appear on and leave the frontend's ``/v1/models``.

Rounds of ``load_lora`` then ``unload_lora`` of one cached (``file://``)
adapter on a mocker worker, timing the call and the moment ``/v1/models`` on
the frontend lists it (or stops listing it). First with nothing else loaded,
then with 1,000 adapters published across 4 workers, where ``/v1/models``
itself is timed too.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, Final

from bench._adapters import FrontendModels, models_latency, populate, run_rounds
from bench._cluster import BenchCluster
from bench._cold import cold_rounds
from bench._report import add_output_flags, benchmark_main, machine, table

__all__ = ["build_parser", "main", "run"]

MODEL: Final = "demo"
HF_READY_TIMEOUT_S: Final = 300.0
COLD_ENGINES: Final = ("mocker", "hf")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Time the rounds empty and with ``--adapters`` loaded, then cold requests per engine."""
    scenarios = await _mocker_fleet(args)
    if "hf" in args.cold_engines:
        scenarios["cold_hf"] = await _cold_hf(args)
    return {
        "bench": "lora",
        "machine": machine(),
        "settings": {"rounds": args.rounds, "adapters": args.adapters, "workers": args.workers,
                     "poll_interval_ms": args.poll_interval_ms, "samples": args.samples,
                     "cold_rounds": args.cold_rounds, "cold_engines": args.cold_engines},
        "results": scenarios,
    }  # fmt: skip


async def _mocker_fleet(args: argparse.Namespace) -> dict[str, Any]:
    poll_s = args.poll_interval_ms / 1000
    per_worker = -(-args.adapters // args.workers) + 2
    scenarios: dict[str, Any] = {}
    with BenchCluster() as cluster:
        flags = ("--enable-lora", "--max-loras", str(per_worker))
        workers = [cluster.worker(MODEL, *flags, wait=False) for _ in range(args.workers)]
        for worker in workers:
            cluster.await_worker(worker)
        service = cluster.frontend()
        frontend = FrontendModels(service)
        uri = cluster.adapter("bench-probe")
        empty = await run_rounds(frontend, workers[0], uri, args.rounds, poll_s)
        scenarios["empty"] = {**empty.summary(), **await models_latency(frontend, args.samples)}
        if "mocker" in args.cold_engines:
            scenarios["cold_mocker"] = await cold_rounds(
                service, workers, name="bench-cold", uri=cluster.adapter("bench-cold"),
                base=MODEL, rounds=args.cold_rounds,
            )  # fmt: skip
        populate_s = await populate(cluster, workers, args.adapters)
        loaded = await run_rounds(frontend, workers[0], uri, args.rounds, poll_s)
        scenarios["populated"] = {
            **loaded.summary(),
            **await models_latency(frontend, args.samples),
            "populate_s": round(populate_s, 2),
        }
    return scenarios


async def _cold_hf(args: argparse.Namespace) -> dict[str, Any]:
    """Cold requests for the demo model's pirate adapter on one hf worker."""
    from lorafleet.launch.demo_model import DEMO_MODEL_NAME, ensure_demo_model

    demo = await asyncio.to_thread(ensure_demo_model)
    with BenchCluster() as cluster:
        worker = cluster.worker(
            str(demo.base), "--served-model-name", DEMO_MODEL_NAME, "--enable-lora",
            engine="hf", wait=False,
        )  # fmt: skip
        cluster.await_worker(worker, timeout_s=HF_READY_TIMEOUT_S)
        frontend = cluster.frontend()
        return await cold_rounds(
            frontend, [worker], name="pirate", uri=f"file://{demo.adapters['pirate']}",
            base=DEMO_MODEL_NAME, rounds=args.cold_rounds,
        )  # fmt: skip


def _text(results: dict[str, Any]) -> str:
    settings, scenarios = results["settings"], results["results"]
    headers = [
        "scenario", "rounds", "errors", "load call p50", "visible p50", "visible max",
        "unload call p50", "gone p50", "gone max", "/v1/models p50", "bytes", "entries",
    ]  # fmt: skip
    rows = [
        [name, r["rounds"], r["errors"], r["load_call_p50_ms"], r["visible_p50_ms"],
         r["visible_max_ms"], r["unload_call_p50_ms"], r["gone_p50_ms"], r["gone_max_ms"],
         r["models_p50_ms"], r["models_bytes"], r["models_entries"]]
        for name, r in scenarios.items() if not name.startswith("cold_")
    ]  # fmt: skip
    title = (f"times in ms; populated: {settings['adapters']} adapters over "
             f"{settings['workers']} workers")  # fmt: skip
    text = title + "\n" + table(headers, rows)
    cold = [
        [name.removeprefix("cold_"), r["rounds"], r["cold_p50_ms"], r["cold_max_ms"],
         r["warm_p50_ms"], r["on_demand_cost_p50_ms"]]
        for name, r in scenarios.items() if name.startswith("cold_")
    ]  # fmt: skip
    if cold:
        cold_headers = ["cold requests: engine", "rounds", "cold p50", "cold max", "warm p50",
                        "on-demand cost p50"]  # fmt: skip
        text += "\n\n" + table(cold_headers, cold)
    return text


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(prog="python -m bench.lora", description=__doc__)
    parser.add_argument("--rounds", type=int, default=50, help="load+unload rounds per scenario")
    parser.add_argument("--adapters", type=int, default=1000, help="adapters already published")
    parser.add_argument("--workers", type=int, default=4, help="workers the adapters spread over")
    parser.add_argument("--samples", type=int, default=200, help="timed GET /v1/models")
    parser.add_argument("--cold-rounds", type=int, default=20, help="cold requests per engine")
    parser.add_argument("--cold-engines", nargs="*", choices=COLD_ENGINES, default=["mocker"],
                        help="engines to time cold (on-demand) requests on; hf builds the demo "
                        "model (cached) and needs the hf extra")  # fmt: skip
    parser.add_argument("--poll-interval-ms", type=float, default=0.5,
                        help="pause between /v1/models polls")  # fmt: skip
    add_output_flags(parser)
    return parser


main: Final = benchmark_main(build_parser, run, lambda results, _: _text(results))


if __name__ == "__main__":
    sys.exit(main())
