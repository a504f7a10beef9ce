"""``python -m bench.prefix``: routers side by side on workloads that share prefixes.

For each workload and each router, a fresh cluster (etcd, NATS, ``--workers`` workers with
empty caches, one frontend with ``--router``) serves ``--adapters`` adapters, each loaded
on every worker, and ``--clients`` clients run the workload's conversations (streamed
chats, each turn after the last one's answer), one conversation after another; with
``--rate``, conversations instead start at that rate (Poisson arrivals, an open loop),
however many are still running. With ``--at-once`` each round starts every router's
cluster first and drives them all together, so the machine's other work weighs on each
alike (the frontends' CPU ratio then varies a few percent between rounds, not tens; TTFT
and req/s share the cores). Workloads (``bench/_prefix_workloads.py``):
``shared``, 32 system prompts of about 2,000 tokens spread over the adapters, 8 questions
each, in random order; ``multiturn``, 64 conversations of 6 turns; ``unique``, no shared
prefix (the control).

Figures per run: TTFT p50/p90 (``bench/_prefix_client.py``: TCP_QUICKACK, so no delayed ACK
hides in them), requests per second, the fleet's prefix-cache hit ratio from the workers'
own counters (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``) beside the ideal
(each block computed once in the fleet), requests on the busiest instance over the mean
(from the workers' request counters), and the frontend's CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from typing import Any, Final

import httpx

from bench._adapters import admin
from bench._cluster import BenchCluster, Service
from bench._metrics import scrape
from bench._prefix_client import ChatClient, ChatResult
from bench._prefix_workloads import WORKLOADS, Job, Sizes, build_jobs, ideal_hits
from bench._report import (
    add_output_flags,
    benchmark_main,
    cpu_seconds,
    machine,
    median,
    ms,
    percentile,
    table,
)

__all__ = ["build_parser", "main", "run"]

ROUTERS: Final = ("round-robin", "least-inflight", "prefix-approx", "prefix")
READY_TIMEOUT_S: Final = 120.0
POLL_S: Final = 0.1


async def _serve(cluster: BenchCluster, args: argparse.Namespace, router: str) -> Service:
    """Start the workers, load every adapter on each, start the frontend; wait until it
    lists every adapter."""
    slots = max(1, len(_adapters(cluster, args)))
    flags = ["--enable-lora", "--max-loras", str(slots), *args.worker_arg]
    workers = [cluster.worker(args.model, *flags, engine=args.engine, wait=False)
               for _ in range(args.workers)]  # fmt: skip
    for worker in workers:
        cluster.await_worker(worker)
    for name, uri in _adapters(cluster, args):
        for worker in workers:
            status = await admin(worker, "load_lora", {"lora_name": name, "source": {"uri": uri}})
            if status != 200:
                raise RuntimeError(f"load_lora of {name!r} answered HTTP {status}")
    frontend = cluster.frontend("--router", router, *args.frontend_arg)
    wanted = {name for name, _ in _adapters(cluster, args)}
    async with httpx.AsyncClient(timeout=10) as http, asyncio.timeout(READY_TIMEOUT_S):
        while not wanted <= {
            m["id"] for m in (await http.get(f"{frontend.url}/v1/models")).json()["data"]
        }:
            await asyncio.sleep(POLL_S)
    return frontend


def _adapters(cluster: BenchCluster, args: argparse.Namespace) -> list[tuple[str, str]]:
    """(name, URI) of the adapters served: ``--adapter`` flags, else placeholder folders."""
    if args.adapter:
        return [(pair.split("=", 1)[0], pair.split("=", 1)[1]) for pair in args.adapter]
    return [(f"a{index}", cluster.adapter(f"a{index}")) for index in range(args.adapters)]


async def _client(
    port: int, args: argparse.Namespace, jobs: asyncio.Queue[Job], sent: list[Any],
    results: list[ChatResult],
) -> None:  # fmt: skip
    """Take conversations off the queue, one after another (a closed loop)."""
    client = ChatClient("127.0.0.1", port, args.max_tokens)
    try:
        while not jobs.empty():
            await _converse(client, jobs.get_nowait(), sent, results)
    finally:
        await client.close()


async def _arrival(
    port: int, args: argparse.Namespace, job: Job, sent: list[Any], results: list[ChatResult]
) -> None:
    """One conversation of the open loop, on a connection of its own."""
    client = ChatClient("127.0.0.1", port, args.max_tokens)
    try:
        await _converse(client, job, sent, results)
    finally:
        await client.close()


async def _converse(
    client: ChatClient, job: Job, sent: list[Any], results: list[ChatResult]
) -> None:
    """Run each turn of ``job`` after the last one's answer."""
    for turn in range(len(job.users)):
        messages = job.messages(turn)
        result = await client.chat(job.model, messages)
        results.append(result)
        sent.append((job.model, messages, result.text))
        job.answers.append(result.text)


async def _counters(workers: Sequence[Service]) -> list[dict[str, float]]:
    """Each worker's prefix-cache counters (tokens) and requests handled."""
    out = []
    for worker in workers:
        metrics = await scrape(worker.port)
        out.append({
            "hits": metrics.total("vllm:prefix_cache_hits_total"),
            "queries": metrics.total("vllm:prefix_cache_queries_total"),
            "requests": metrics.total("lorafleet_worker_requests_total"),
        })  # fmt: skip
    return out


async def _drive(
    port: int, models: list[str], args: argparse.Namespace, workload: str
) -> tuple[list[ChatResult], list[Any], float]:
    """Run ``workload``'s jobs with ``--clients`` clients, or open loop at ``--rate``:
    results, (model, messages, answer) in sending order, and the seconds it took."""
    jobs = build_jobs(workload, models, _sizes(args), seed=args.seed)
    sent: list[Any] = []
    results: list[ChatResult] = []
    started = time.perf_counter()
    if args.rate:
        # users who do not wait for each other: a conversation starts every 1/rate s on
        # average (Poisson), however many are still running, so queues show in TTFT
        arrivals = random.Random(f"arrivals-{args.seed}")
        async with asyncio.TaskGroup() as group:
            for number, job in enumerate(jobs):
                if number:
                    await asyncio.sleep(arrivals.expovariate(args.rate))
                group.create_task(_arrival(port, args, job, sent, results))
    else:
        queue: asyncio.Queue[Job] = asyncio.Queue()
        for job in jobs:
            queue.put_nowait(job)
        await asyncio.gather(*(_client(port, args, queue, sent, results)
                               for _ in range(args.clients)))  # fmt: skip
    return results, sent, time.perf_counter() - started


async def _one_run(args: argparse.Namespace, workload: str, router: str) -> dict[str, Any]:
    """One workload on a fresh lorafleet cluster whose frontend runs ``router``."""
    with BenchCluster() as cluster:
        return await _measure(cluster, await _serve(cluster, args, router), args, workload)


async def _runs_at_once(
    args: argparse.Namespace, workload: str, routers: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """One workload on a fresh cluster per router, all started first and driven together:
    whatever else the machine does then falls on every router alike."""
    with contextlib.ExitStack() as stack:
        clusters = [stack.enter_context(BenchCluster()) for _ in routers]
        frontends = [await _serve(c, args, r) for c, r in zip(clusters, routers, strict=True)]
        pairs = zip(clusters, frontends, strict=True)
        runs = await asyncio.gather(*(_measure(c, f, args, workload) for c, f in pairs))
    return dict(zip(routers, runs, strict=True))


async def _measure(
    cluster: BenchCluster, frontend: Service, args: argparse.Namespace, workload: str
) -> dict[str, Any]:
    """Drive ``workload`` through ``frontend``; its figures and the workers' counters'."""
    workers = [s for s in cluster.services if s is not frontend]
    models = [name for name, _ in _adapters(cluster, args)] or [args.model]
    before, cpu_before = await _counters(workers), cpu_seconds(frontend.process.pid)
    results, sent, elapsed = await _drive(frontend.port, models, args, workload)
    cpu = cpu_seconds(frontend.process.pid) - cpu_before
    after = await _counters(workers)
    delta = [{key: a[key] - b[key] for key in a} for a, b in zip(after, before, strict=True)]
    queries = sum(d["queries"] for d in delta)
    per_instance = [d["requests"] for d in delta]
    return {
        **_figures(results, elapsed, cpu),
        "hit_ratio": round(sum(d["hits"] for d in delta) / queries, 3) if queries else None,
        "ideal_hit_ratio": round(ideal_hits(sent, args.block_size) / queries, 3)
        if queries and args.engine == "mocker" else None,  # words are tokens for the mocker alone
        "busiest_over_mean": round(max(per_instance) * len(per_instance) / sum(per_instance), 2)
        if sum(per_instance) else None,
    }  # fmt: skip


async def _target_run(args: argparse.Namespace, workload: str) -> dict[str, Any]:
    """One workload against a running OpenAI-compatible stack (``--target-url``), such as
    Dynamo's frontend; its hit ratio comes from the answers' ``cached_tokens``."""
    port = int(args.target_url.rsplit(":", 1)[1].strip("/"))
    cpu_before = cpu_seconds(args.target_pid) if args.target_pid else 0.0
    results, _sent, elapsed = await _drive(port, args.target_model, args, workload)
    cpu = cpu_seconds(args.target_pid) - cpu_before if args.target_pid else 0.0
    return _figures(results, elapsed, cpu)


def _figures(results: list[ChatResult], elapsed: float, cpu: float) -> dict[str, Any]:
    """The figures every run has: from the clients' own readings."""
    ttfts = [r.ttft_s for r in results if r.ok and r.ttft_s is not None]
    prompt = sum(r.prompt_tokens for r in results)
    return {
        "requests": len(results),
        "failed": sum(1 for r in results if not r.ok),
        "ttft_p50_ms": ms(percentile(ttfts, 0.5)),
        "ttft_p90_ms": ms(percentile(ttfts, 0.9)),
        "req_per_s": round(len(results) / elapsed, 2),
        "answered_hit_ratio": round(sum(r.cached_tokens for r in results) / prompt, 3)
        if prompt else None,
        "frontend_cpu_ms_per_request": round(cpu * 1000 / max(1, len(results)), 3),
    }  # fmt: skip


def _sizes(args: argparse.Namespace) -> Sizes:
    return Sizes(
        prefixes=args.prefixes, prefix_words=args.prefix_words, question_words=args.question_words,
        conversations=args.conversations, turns=args.turns, opening_words=args.opening_words,
        unique_requests=args.unique_requests, unique_words=args.unique_words,
    )  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every workload under every router, each on a fresh cluster, ``--repeat`` rounds."""
    rounds: list[dict[str, dict[str, dict[str, Any]]]] = []
    for number in range(args.repeat):
        runs: dict[str, dict[str, dict[str, Any]]] = {workload: {} for workload in args.workloads}
        for workload in args.workloads:
            if args.target_url:
                runs[workload][args.target_label] = await _target_run(args, workload)
                continue
            if args.at_once:
                runs[workload] = await _runs_at_once(args, workload, args.routers)
                continue
            # every other round backwards: no router always runs first on a warm machine
            for router in args.routers if number % 2 == 0 else args.routers[::-1]:
                runs[workload][router] = await _one_run(args, workload, router)
        rounds.append(runs)
    results = {
        workload: {label: _row([r[workload][label] for r in rounds],
                               [r[workload].get("least-inflight") for r in rounds])
                   for label in rounds[0][workload]}
        for workload in args.workloads
    }  # fmt: skip
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    return {"bench": "prefix", "machine": machine(), "settings": settings, "results": results}


def _row(runs: list[dict[str, Any]], baselines: list[dict[str, Any] | None]) -> dict[str, Any]:
    """One router's figures over the rounds: each figure's median, requests and failures
    summed, and its frontend CPU over least-inflight's in the same round (the median of
    those ratios: runs next to each other in time share the machine's mood, which moves
    whole-frontend CPU by about 20% over minutes)."""
    cpu = "frontend_cpu_ms_per_request"
    row: dict[str, Any] = {key: median([run[key] for run in runs]) for key in runs[0]}
    row |= {"requests": sum(run["requests"] for run in runs),
            "failed": sum(run["failed"] for run in runs), "repeats": len(runs),
            "cpu_over_least_inflight": median([
                run[cpu] / base[cpu] for run, base in zip(runs, baselines, strict=True)
                if base is not None and base[cpu]
            ])}  # fmt: skip
    if len(runs) > 1:
        row["runs"] = runs
    return row


def _text(results: dict[str, Any], args: argparse.Namespace) -> str:
    headers = ["workload", "router", "n", "failed", "TTFT p50 ms", "p90 ms", "req/s",
               "hit ratio", "ideal", "answered", "busiest/mean", "frontend CPU ms/req",
               "CPU / least-inflight's"]  # fmt: skip
    rows = [
        [workload, router, f["requests"], f["failed"], f["ttft_p50_ms"], f["ttft_p90_ms"],
         f["req_per_s"], f.get("hit_ratio"), f.get("ideal_hit_ratio"), f["answered_hit_ratio"],
         f.get("busiest_over_mean"), f["frontend_cpu_ms_per_request"],
         f["cpu_over_least_inflight"]]
        for workload, by_router in results["results"].items() for router, f in by_router.items()
    ]  # fmt: skip
    return table(headers, rows)


def _rounds(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of rounds (1 or more)")
    return int(value)


def _rate(value: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not rate > 0 or rate == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a rate (conversations per second > 0)")
    return rate


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.prefix", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=ROUTERS)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rate", type=_rate, default=0.0,
                        help="open loop: conversations started per second (Poisson), "
                             "instead of --clients")  # fmt: skip
    against = parser.add_mutually_exclusive_group()
    against.add_argument("--at-once", action="store_true",
                         help="a cluster per router, all driven together (CPU ratios: the "
                              "machine's noise falls on every router alike)")  # fmt: skip
    parser.add_argument("--engine", default="mocker", choices=("mocker", "hf", "vllm"))
    parser.add_argument("--model", default="demo", help="the workers' model (a path for hf/vllm)")
    parser.add_argument("--worker-arg", action="append", default=[],
                        help="a worker flag (repeatable): --worker-arg=--max-loras=8")  # fmt: skip
    parser.add_argument("--frontend-arg", action="append", default=[],
                        help="a frontend flag (repeatable): --frontend-arg=--router=x")  # fmt: skip
    parser.add_argument("--adapters", type=int, default=4,
                        help="placeholder adapters (mocker; 0: the base model alone)")  # fmt: skip
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=URI",
                        help="serve these adapters instead of placeholders (hf, vllm)")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per answer")
    parser.add_argument("--block-size", type=int, default=16, help="the engines' (for the ideal)")
    parser.add_argument("--prefixes", type=int, default=32)
    parser.add_argument("--prefix-words", type=int, default=2000)
    parser.add_argument("--question-words", type=int, default=24)
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument(
        "--opening-words", type=int, default=600, help="a conversation's first turn"
    )
    parser.add_argument("--unique-requests", type=int, default=256)
    parser.add_argument("--unique-words", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=_rounds, default=1,
                        help="rounds of every workload and router (table: medians)")  # fmt: skip
    against.add_argument(
        "--target-url",
        default="",
        help="drive this running stack instead of starting lorafleet clusters",
    )
    parser.add_argument(
        "--target-model",
        nargs="+",
        default=["demo"],
        help="with --target-url: the models to spread the workload over",
    )
    parser.add_argument("--target-label", default="target", help="with --target-url: its row")
    parser.add_argument("--target-pid", type=int, default=0,
                        help="with --target-url: its frontend pid (CPU per request)")  # fmt: skip
    add_output_flags(parser)
    return parser


main = benchmark_main(build_parser, run, _text)

if __name__ == "__main__":
    raise SystemExit(main())
