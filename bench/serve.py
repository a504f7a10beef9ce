"""``python -m bench.serve``: what serving through the frontend costs, at several concurrencies.

Closed-loop load of chat completions (``max_tokens=4``) through the frontend
to mocker workers with zero time per token, non-streaming and streaming, and
the same generate requests sent straight over NATS to a worker, so the
frontend's own cost per request shows. Prints requests/s, p50/p99 latency,
time to first token, errors and CPU milliseconds per request by process.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from bench._cluster import BenchCluster, Service
from bench._http import HttpConnection, build_request, complete_stream
from bench._load import Call, Outcome, Session, StepResult, run_step
from bench._report import CpuMeter, add_output_flags, benchmark_main, machine, median, table
from lorafleet.discovery.nats_connection import NatsConnection
from lorafleet.discovery.nats_settings import NatsSettings
from lorafleet.frontend.request_plane import RequestPlane
from lorafleet.proto.inference import (
    ChatMessage,
    FinalChunk,
    GenerateRequest,
    SamplingParams,
    TokenChunk,
    decode_chunk,
)

__all__ = ["MODES", "main", "run"]

MODEL: Final = "demo"
PROMPT: Final = "tell me a story"
MAX_TOKENS: Final = 4
NATS_REPLY_TIMEOUT_S: Final = 10.0
MODES: Final = ("chat", "chat-stream", "nats")
"""``chat``: whole answers via the frontend; ``chat-stream``: SSE; ``nats``: no frontend."""


def _chat_body(stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "stream": stream,
    }


def http_session(port: int, *, stream: bool) -> Session:
    """Each task: one keep-alive connection sending the same pre-built chat request."""
    raw = build_request("POST", "127.0.0.1", port, "/v1/chat/completions", _chat_body(stream))

    async def open_session() -> tuple[Call, Callable[[], Awaitable[None]]]:
        connection = await HttpConnection.open("127.0.0.1", port)

        async def call() -> Outcome:
            response = await connection.request(raw, watch_tokens=stream)
            ok = complete_stream(response) if stream else response.status == 200
            return Outcome(ok, response.first_token_at)

        return call, connection.close

    return open_session


def nats_session(plane: RequestPlane, subjects: Sequence[str]) -> Session:
    """Each task: generate requests straight to the workers' subjects, round robin."""
    turn = itertools.count()
    sampling = SamplingParams(max_tokens=MAX_TOKENS)
    messages = [ChatMessage(role="user", content=PROMPT)]

    async def call() -> Outcome:
        index = next(turn)
        request = GenerateRequest(
            request_id=f"bench-{index}", model=MODEL, messages=messages, sampling=sampling
        )
        reply = await plane.open(subjects[index % len(subjects)], request)
        first_token_at = None
        try:
            while (msg := await reply.next(NATS_REPLY_TIMEOUT_S)) is not None:
                chunk = decode_chunk(msg.data)
                if isinstance(chunk, TokenChunk) and first_token_at is None:
                    first_token_at = time.perf_counter()
                elif isinstance(chunk, FinalChunk):
                    return Outcome(True, first_token_at)
                elif not isinstance(chunk, TokenChunk):
                    return Outcome(False)
            return Outcome(False)
        finally:
            reply.close()

    async def open_session() -> tuple[Call, Callable[[], Awaitable[None]]]:
        async def close() -> None:
            return None

        return call, close

    return open_session


async def _run_mode(
    mode: str,
    args: argparse.Namespace,
    cluster: BenchCluster,
    frontend: Service,
    workers: list[Service],
) -> list[StepResult]:
    assert cluster.nats is not None
    groups = {"frontend": [frontend.pid], "workers": [w.pid for w in workers],
              "client": [os.getpid()], "nats_server": [cluster.nats.pid]}  # fmt: skip
    plane: RequestPlane | None = None
    conn: NatsConnection | None = None
    if mode == "nats":
        settings = NatsSettings.from_env(cluster.nats.url)
        conn = await NatsConnection.connect(settings, name="bench-client")
        plane = await RequestPlane.start(conn)
        session = nats_session(plane, [w.subject for w in workers])
    else:
        session = http_session(frontend.port, stream=mode == "chat-stream")
    results = []
    try:
        for concurrency in args.concurrency:
            for _ in range(args.repeat):
                step = await run_step(
                    session, concurrency=concurrency, duration_s=args.duration_s,
                    warmup_s=args.warmup_s, cpu=CpuMeter(groups),
                )  # fmt: skip
                results.append(step)
    finally:
        if plane is not None:
            await plane.aclose()
        if conn is not None:
            await conn.aclose()
    return results


def _median_row(mode: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row: medians over the repeats of one (mode, concurrency)."""

    def med(key: str, sub: str | None = None) -> float | None:
        return median([s[key] if sub is None else s[key][sub] for s in steps])

    return {
        "mode": mode, "concurrency": steps[0]["concurrency"], "repeats": len(steps),
        "requests_per_s": med("requests_per_s"), "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
        "ttft_p50_ms": med("ttft_p50_ms"), "errors": sum(s["errors"] for s in steps),
        "cpu_ms_per_request": {
            name: med("cpu_ms_per_request", name) for name in steps[0]["cpu_ms_per_request"]
        },
    }  # fmt: skip


def _summarise(raw: dict[str, list[StepResult]]) -> list[dict[str, Any]]:
    rows = []
    for mode, steps in raw.items():
        by_concurrency: dict[int, list[dict[str, Any]]] = {}
        for step in steps:
            by_concurrency.setdefault(step.concurrency, []).append(step.summary())
        rows += [_median_row(mode, group) for group in by_concurrency.values()]
    return rows


def _text(rows: list[dict[str, Any]]) -> str:
    headers = ["mode", "conc", "req/s", "p50 ms", "p99 ms", "ttft p50", "errors",
               "cpu ms/req: frontend", "workers", "client", "nats-server"]  # fmt: skip
    body = [
        [r["mode"], r["concurrency"], r["requests_per_s"], r["p50_ms"], r["p99_ms"],
         r["ttft_p50_ms"], r["errors"], r["cpu_ms_per_request"].get("frontend"),
         r["cpu_ms_per_request"]["workers"], r["cpu_ms_per_request"]["client"],
         r["cpu_ms_per_request"]["nats_server"]]
        for r in rows
    ]  # fmt: skip
    return table(headers, body)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the cluster, run every mode at every concurrency, return the results."""
    with BenchCluster() as cluster:
        option = ("--mocker-time-per-token-s", "0")
        workers = [cluster.worker(MODEL, *option, wait=False) for _ in range(args.workers)]
        for worker in workers:
            cluster.await_worker(worker)
        frontend = cluster.frontend()
        raw = {mode: await _run_mode(mode, args, cluster, frontend, workers)
               for mode in args.modes}  # fmt: skip
    return {
        "bench": "serve",
        "machine": machine(),
        "settings": {
            "workers": args.workers, "duration_s": args.duration_s, "warmup_s": args.warmup_s,
            "repeat": args.repeat, "max_tokens": MAX_TOKENS, "mocker_time_per_token_s": 0,
        },
        "results": _summarise(raw),
        "runs": {mode: [step.summary() for step in steps] for mode, steps in raw.items()},
    }  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__)
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured window per step")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured lead-in per step")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--workers", type=int, default=1, help="mocker workers")
    parser.add_argument("--repeat", type=int, default=1, help="runs per step (table: medians)")
    add_output_flags(parser)
    return parser


main: Final = benchmark_main(build_parser, run, lambda results, _: _text(results["results"]))


if __name__ == "__main__":
    sys.exit(main())
