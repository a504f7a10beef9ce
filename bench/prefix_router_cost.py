"""``python -m bench.prefix_router_cost``: the frontend CPU that prefix routing adds per
request, in one process, with no cluster around it.

``bench.prefix`` measures a whole frontend's CPU per request, which moves by about 20% from
run to run on a shared machine: too coarse to say what the router itself costs. This
routes ``bench.prefix``'s workloads (first turns) through each router over ``--instances``
instances of the mocker's word tokenizer, and times with the process's CPU clock what a
frontend does per request: the route, and for ``prefix`` the decode and apply of the
chosen worker's batch of stored blocks (the worker's encoding is not counted). Evictions
are left out: the workers' removed blocks cost about what their stores do.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from bench._prefix_workloads import WORKLOADS, Sizes, build_jobs
from lorafleet.frontend.card_view import CardView
from lorafleet.frontend.kv.prefix_index import PrefixIndex
from lorafleet.frontend.kv.prefix_memory import PrefixMemory
from lorafleet.frontend.kv.prefix_router import PrefixRouter
from lorafleet.frontend.kv.prompt_blocks import HfTokenizers, PromptBlocks
from lorafleet.frontend.kv.routing_metrics import RoutingMetrics
from lorafleet.frontend.registry import ServedModel
from lorafleet.frontend.router import LeastInflightRouter, Router
from lorafleet.proto.discovery import Instance
from lorafleet.proto.inference import ChatMessage, GenerateRequest, encode_msg
from lorafleet.proto.kv_events import (
    BlocksStored,
    KvCacheSpec,
    KvEvent,
    KvEventBatch,
    decode_kv_batch,
)

MODEL = "demo"
SPEC = KvCacheSpec(block_size=16, num_blocks=2048, events=True, tokenizer="words")
ROUTERS = ("least-inflight", "prefix-approx", "prefix")


def _card() -> CardView:
    return CardView(name=MODEL, parent=None, source="", model_type=("chat",), context_length=0,
                    enable_lora=True, max_lora_rank=0, created=0)  # fmt: skip


def _served(count: int) -> ServedModel:
    instances = tuple(
        Instance(namespace="bench", component="backend", endpoint="generate", instance_id=i,
                 subject=f"bench.backend.generate-{i:x}", kv_cache=SPEC)
        for i in range(1, count + 1)
    )  # fmt: skip
    return ServedModel(name=MODEL, card=_card(), instances=instances)


def _requests(workload: str) -> list[GenerateRequest]:
    jobs = build_jobs(workload, [MODEL], Sizes())
    return [
        GenerateRequest(request_id=str(n), model=MODEL,
                        messages=[ChatMessage(role=m["role"], content=m["content"])
                                  for m in job.messages(0)])
        for n, job in enumerate(jobs)
    ]  # fmt: skip


def _router(name: str, index: PrefixIndex) -> Router:
    if name == "least-inflight":
        return LeastInflightRouter()
    metrics = RoutingMetrics(CollectorRegistry())
    return PrefixRouter(metrics=metrics, cards=lambda _model, _iid: _card(),
                        memory=PrefixMemory(), index=index if name == "prefix" else None,
                        follows=lambda _iid: name == "prefix")  # fmt: skip


def cpu_per_request_us(name: str, requests: Sequence[GenerateRequest], instances: int) -> float:
    """Microseconds of this process's CPU per request that ``name`` costs a frontend."""
    served = _served(instances)
    index = PrefixIndex()
    router = _router(name, index)
    seq: dict[int, int] = {}
    tokenizers = HfTokenizers()  # the worker's side; the words tokenizer needs no model
    spent = 0.0
    clock: Callable[[], float] = time.process_time
    for request in requests:
        began = clock()
        chosen = router.route(served, request)
        assert chosen is not None
        iid = chosen.instance_id
        router.started(iid, router.load_of(request, iid))
        router.finished(iid, router.load_of(request, iid))
        spent += clock() - began
        if name == "prefix":  # what the chosen worker publishes, then what the frontend does
            seq[iid] = seq.get(iid, 0) + 1
            chain = PromptBlocks(request, tokenizers).token_chain(SPEC, MODEL)
            hashes = list(chain) if chain is not None else []
            stored: list[KvEvent] = [BlocksStored(version=MODEL, hashes=hashes)]
            batch = encode_msg(KvEventBatch(instance_id=iid, seq=seq[iid], sent_at=0.0,
                                            events=stored))  # fmt: skip
            began = clock()
            decoded = decode_kv_batch(batch)
            index.apply(decoded.instance_id, decoded.events)
            spent += clock() - began
    return spent / len(requests) * 1e6


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["unique", "shared"])
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5, help="runs per router; the median")
    args = parser.parse_args(argv)
    print("| workload | router | CPU us/request (median of runs) |")
    print("|---|---|---|")
    for workload in args.workloads:
        requests = _requests(workload)
        for name in ROUTERS:
            runs = sorted(cpu_per_request_us(name, requests, args.instances)
                          for _ in range(args.repeat))  # fmt: skip
            print(f"| {workload} | {name} | {runs[len(runs) // 2]:.1f} |")


if __name__ == "__main__":
    main()
