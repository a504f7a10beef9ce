"""``python -m bench.slo``: an adapter that misses its TTFT target gets a copy; attainment
before and after.

Two mocker workers that generate ``--max-running`` requests at a time (the others queue,
as in a busy engine) serve adapter ``hot``, declared with ``min_replicas`` 1,
``max_replicas`` 2 and a TTFT p95 target (``--ttft-p95-ms``). Demand alone keeps one copy
(``--lora-copy-rps`` 100: a copy per 70 req/s). ``--concurrency`` clients loop on
streamed completions, more than one copy runs at once, so requests queue on it and miss
the target; the frontend's judging adds a copy, the queue splits over two, and TTFT falls.
Figures: seconds until the copy was added, the reason ``/v1/adapters`` gave, and for the
requests before it and after it (from one window after it): client-side TTFT p50/p95 and
the share within the target, beside the fleet's judged windows as ``/v1/adapters``
showed them.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from bench._cluster import BenchCluster
from bench._report import add_output_flags, benchmark_main, machine, ms, percentile, table

__all__ = ["build_parser", "main", "run"]

MODEL: Final = "demo"
ADAPTER: Final = "hot"
READY_TIMEOUT_S: Final = 60.0
POLL_S: Final = 0.25


@dataclass
class Run:
    """What the clients and the monitor saw."""

    ttfts: list[tuple[float, float]] = field(default_factory=list)
    """(start, TTFT in s) of each answered request."""
    failed: int = 0
    windows: list[dict[str, Any]] = field(default_factory=list)
    """``/v1/adapters``' attainment each time its window changed."""
    added_at: float | None = None
    reason: str = ""


async def _client(http: httpx.AsyncClient, url: str, run: Run, stop: asyncio.Event) -> None:
    body = {"model": ADAPTER, "prompt": "hi", "max_tokens": 4, "stream": True}
    while not stop.is_set():
        started = time.monotonic()
        async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
            ttft = None
            async for line in response.aiter_lines():
                if ttft is None and line.startswith("data: {"):
                    ttft = time.monotonic() - started
        if response.status_code == 200 and ttft is not None:
            run.ttfts.append((started, ttft))
        else:
            run.failed += 1


async def _monitor(http: httpx.AsyncClient, url: str, run: Run, stop: asyncio.Event) -> None:
    """Follow ``/v1/adapters/hot``: each judged window, and when the second copy is live."""
    last: dict[str, Any] = {}
    while not stop.is_set():
        status = (await http.get(f"{url}/v1/adapters/{ADAPTER}")).json()
        shown = status.get("attainment") or {}
        if shown.get("requests") and shown != last:
            run.windows.append({"at_s": round(time.monotonic(), 2), **shown})
            last = shown
        if run.added_at is None and len(status["instances"]) >= 2:
            run.added_at, run.reason = time.monotonic(), shown.get("reason", "")
        await asyncio.sleep(POLL_S)


def _figures(samples: list[float], target_s: float) -> dict[str, Any]:
    within = sum(1 for ttft in samples if ttft <= target_s)
    return {
        "requests": len(samples),
        "ttft_p50_ms": ms(percentile(samples, 0.5)),
        "ttft_p95_ms": ms(percentile(samples, 0.95)),
        "within_target": round(within / len(samples), 3) if samples else None,
    }


async def _measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    run, stop = Run(), asyncio.Event()
    async with httpx.AsyncClient(timeout=60) as http:
        tasks = [
            asyncio.create_task(_client(http, url, run, stop)) for _ in range(args.concurrency)
        ]
        monitor = asyncio.create_task(_monitor(http, url, run, stop))
        began = time.monotonic()
        try:
            async with asyncio.timeout(args.add_timeout_s):
                while run.added_at is None:
                    await asyncio.sleep(POLL_S)
            await asyncio.sleep(args.after_s)
        except TimeoutError:
            pass  # no copy added: the figures say so
        finally:
            stop.set()
            await asyncio.gather(*tasks, monitor)
    target_s, settled = args.ttft_p95_ms / 1000, (run.added_at or 0) + args.window_s
    before = [t for start, t in run.ttfts if run.added_at is None or start < run.added_at]
    after = [t for start, t in run.ttfts if run.added_at is not None and start >= settled]
    for window in run.windows:
        window["at_s"] = round(window["at_s"] - began, 2)
    return {
        "copy_added_after_s": None if run.added_at is None else round(run.added_at - began, 2),
        "reason": run.reason,
        "failed": run.failed,
        "before": _figures(before, target_s),
        "after": _figures(after, target_s),
        "judged_windows": run.windows,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the fleet, declare ``hot`` with its target, load it, and measure."""
    with BenchCluster() as cluster:
        engine = ("--engine-option", f"time_per_token_s={args.time_per_token_s}",
                  "--engine-option", f"max_running={args.max_running}")  # fmt: skip
        flags = ("--enable-lora", "--max-loras", "4", "--lora-copy-rps", "100", *engine)
        workers = [cluster.worker(MODEL, *flags, wait=False) for _ in range(2)]
        for worker in workers:
            cluster.await_worker(worker)
        frontend = cluster.frontend("--slo-window-s", str(args.window_s),
                                    "--slo-min-requests", "10")  # fmt: skip
        await _declare(frontend.url, cluster.adapter(ADAPTER), args.ttft_p95_ms)
        figures = await _measure(frontend.url, args)
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    return {"bench": "slo", "machine": machine(), "settings": settings, "results": figures}


async def _declare(url: str, uri: str, ttft_p95_ms: float) -> None:
    """Declare ``hot`` and wait until its one copy is placed."""
    spec = {"name": ADAPTER, "base_model": MODEL, "source": {"uri": uri}, "min_replicas": 1,
            "max_replicas": 2, "slo": {"ttft_p95_ms": ttft_p95_ms}}  # fmt: skip
    async with httpx.AsyncClient(timeout=30) as http:
        (await http.post(f"{url}/v1/adapters", json=spec)).raise_for_status()
        async with asyncio.timeout(READY_TIMEOUT_S):
            while (await http.get(f"{url}/v1/adapters/{ADAPTER}")).json()["state"] != "placed":
                await asyncio.sleep(POLL_S)


def _text(results: dict[str, Any], args: argparse.Namespace) -> str:
    figures = results["results"]
    rows = [
        [phase, f[phase]["requests"], f[phase]["ttft_p50_ms"], f[phase]["ttft_p95_ms"],
         f[phase]["within_target"]]
        for f in (figures,) for phase in ("before", "after")
    ]  # fmt: skip
    phases = table(["requests (client)", "n", "TTFT p50 ms", "p95 ms", "within target"], rows)
    windows = table(
        ["judged window at s", "requests", "attainment", "TTFT p95 ms", "slo copies"],
        [[w["at_s"], w["requests"], w["attainment"], w["ttft_p95_ms"], w["copies"]]
         for w in figures["judged_windows"]],
    )  # fmt: skip
    head = (f"target TTFT p95 {args.ttft_p95_ms:g} ms; copy added after "
            f"{figures['copy_added_after_s']} s: {figures['reason'] or '-'}; "
            f"failed requests {figures['failed']}")  # fmt: skip
    return f"{head}\n\n{phases}\n\n{windows}"


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.slo", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--ttft-p95-ms", type=float, default=60.0, help="the adapter's target")
    parser.add_argument("--concurrency", type=int, default=4, help="client loops")
    parser.add_argument("--max-running", type=int, default=2, help="mocker: requests at once")
    parser.add_argument("--time-per-token-s", type=float, default=0.02, help="mocker speed")
    parser.add_argument("--window-s", type=float, default=2.0, help="the frontend's SLO window")
    parser.add_argument("--after-s", type=float, default=12.0, help="load after the copy")
    parser.add_argument(
        "--add-timeout-s", type=float, default=40.0, help="give up waiting for the copy"
    )
    add_output_flags(parser)
    return parser


main = benchmark_main(build_parser, run, _text)

if __name__ == "__main__":
    raise SystemExit(main())
