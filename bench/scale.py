"""``python -m bench.scale``: one frontend before many instances and adapter cards, under churn.

Real etcd, NATS and one frontend process; the instances are simulated in
this process (``bench._fleet``: each its own lease, NATS subscription and
cards, through the worker's endpoint and LoRA controller over the mocker).
It times the frontend's start-up to a complete registry, its RSS per card,
routing decisions, ``/v1/models``, watch lag under churn, etcd's revision rate
and size, and one worker's placement recomputation. ``--knee`` doubles
instances and cards until something breaks, noting the first shape where a
figure is 10x its value at the default shape.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any, Final

import structlog

from bench._adapters import FrontendModels, models_latency
from bench._cluster import BenchCluster, Service
from bench._fleet import SimulatedFleet
from bench._report import add_output_flags, benchmark_main, machine, ms, table
from bench._scale_probes import (
    Cards,
    churn,
    cpu_s,
    etcd_status,
    placement_per_change,
    routing_decisions,
    rss_kib,
    wait_listing,
)
from lorafleet.discovery.client import EtcdClient, connect_etcd
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.launch.processes import stop_services

__all__ = ["build_parser", "main", "run"]

MODEL: Final = "demo"
READY_TIMEOUT_S: Final = 120.0
KNEE_FACTOR: Final = 10.0
"""A figure this many times its value at the default shape marks the knee."""
TIMED: Final = ("ready_s", "route_p99_us", "models_p50_ms", "lag_p99_ms", "placement_ms")
"""Figures compared with the default shape's to find the knee (bigger is worse)."""
CHURN_KEPT_FRACTION: Final = 0.9
"""Churn below this fraction of ``--churn-per-s`` means the fleet could not keep up."""


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure the default shape, then (``--knee``) doubled shapes until the knee."""
    # the simulated instances would log every load and unload of every card
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    first = await _measure_or_break(args, 1)
    rows, knee, broke = [first], None, _broken(first, args.churn_per_s)
    factor = 2
    while args.knee and not broke and factor <= args.knee_max_factor:
        row = await _measure_or_break(args, factor)
        rows.append(row)
        knee = knee or _slower(first, row)
        broke = _broken(row, args.churn_per_s)
        factor *= 2
    return {
        "bench": "scale",
        "machine": machine(),
        "settings": {key: getattr(args, key) for key in (
            "instances", "cards", "churn_per_s", "churn_s", "samples", "route_samples",
            "knee", "knee_max_factor", "lease_ttl_s")},
        "results": rows,
        "knee": knee,
        "broke": broke or None,
    }  # fmt: skip


async def _measure_or_break(args: argparse.Namespace, factor: int) -> dict[str, Any]:
    """The figures at ``factor`` times the default shape, or what broke there."""
    instances, cards = args.instances * factor, args.cards * factor
    try:
        return await _measure(args, instances, cards)
    except Exception as exc:  # what breaks is the finding: report it, stop doubling
        return {"instances": instances, "cards": cards, "broke": f"{type(exc).__name__}: {exc}"}


def _broken(row: dict[str, Any], churn_per_s: float) -> str | None:
    """What broke at ``row``'s shape (an error, unroutable changes, churn behind), or None."""
    shape = f"{row['instances']} instances, {row['cards']} cards"
    if "broke" in row:
        return f"{shape}: {row['broke']}"
    if row["unroutable"]:
        return f"{shape}: {row['unroutable']} of {row['changes']} changes not routable in 10 s"
    if row["changes_per_s"] < CHURN_KEPT_FRACTION * churn_per_s:
        return f"{shape}: churn fell behind, {row['changes_per_s']} of {churn_per_s} changes/s"
    return None


def _slower(first: dict[str, Any], row: dict[str, Any]) -> str | None:
    """The figures of ``row`` at least 10x their value at the default shape, or None."""
    worse = [
        f"{key} {row[key]} vs {first[key]}"
        for key in TIMED
        if first.get(key) and row.get(key) and row[key] >= KNEE_FACTOR * first[key]
    ]
    if not worse:
        return None
    return f"{row['instances']} instances, {row['cards']} cards: 10x slower: " + "; ".join(worse)


async def _measure(args: argparse.Namespace, instances: int, cards: int) -> dict[str, Any]:
    """Every figure for one shape, on a fresh cluster."""
    row: dict[str, Any] = {"instances": instances, "cards": cards}
    with BenchCluster(lease_ttl_s=args.lease_ttl_s) as cluster:
        etcd = await connect_etcd(cluster.etcd_endpoints)
        fleet = await _start_fleet(cluster, instances, cards)
        try:
            row.update(await _measure_fleet(args, cluster, etcd, fleet, cards))
        finally:
            await fleet.aclose()
            await etcd.close()
    row.update(placement_per_change(instances, cards))
    return row


async def _start_fleet(cluster: BenchCluster, instances: int, cards: int) -> SimulatedFleet:
    assert cluster.nats is not None
    return await SimulatedFleet.start(
        nats_url=cluster.nats.url, etcd_endpoints=cluster.etcd_endpoints,
        namespace=cluster.namespace, count=instances, model=MODEL,
        max_loras=cards + 1, lease_ttl_s=cluster.lease_ttl_s, folder=cluster.root,
    )  # fmt: skip


async def _measure_fleet(
    args: argparse.Namespace,
    cluster: BenchCluster,
    etcd: EtcdClient,
    fleet: SimulatedFleet,
    cards: int,
) -> dict[str, Any]:
    """RSS with base cards only, populate, then a fresh frontend's figures and churn."""
    base, ready_base_s = await _fresh_frontend(cluster, entries=1)
    base_rss_kib, ready_base_cpu_s = rss_kib(base.pid), cpu_s(base.pid)
    _stop(cluster, base)
    book = Cards(fleet)
    populate_s = await book.populate(cards)
    frontend, ready_s = await _fresh_frontend(cluster, entries=cards + 1)
    full_rss_kib, ready_cpu_s = rss_kib(frontend.pid), cpu_s(frontend.pid)
    row: dict[str, Any] = {
        "populate_s": round(populate_s, 2),
        "ready_s": round(ready_s, 3),
        "ready_base_s": round(ready_base_s, 3),
        "ready_cpu_s": round(ready_cpu_s, 2),
        "ready_base_cpu_s": round(ready_base_cpu_s, 2),
        "rss_base_mib": round(base_rss_kib / 1024, 1),
        "rss_full_mib": round(full_rss_kib / 1024, 1),
        "rss_per_card_kib": round((full_rss_kib - base_rss_kib) / max(cards, 1), 2),
    }
    row.update(await models_latency(FrontendModels(frontend), args.samples))
    started = time.perf_counter()
    # open until the end: closing it while its watches are being created can hang (aetcd)
    async with await ModelRegistry.start(etcd, cluster.namespace) as registry:
        registry.names()  # the first read indexes every card
        row["registry_build_ms"] = ms(time.perf_counter() - started)
        row.update(routing_decisions(registry, MODEL, args.route_samples))
        revision_before, _ = await etcd_status(etcd)
        started = time.perf_counter()
        row.update(await churn(book, frontend.port, args.churn_per_s, args.churn_s))
        revision_after, db_bytes = await etcd_status(etcd)
    row["revisions_per_s"] = round(
        (revision_after - revision_before) / (time.perf_counter() - started), 1
    )
    row["etcd_db_mib"] = round(db_bytes / 2**20, 2)
    row["rss_after_churn_mib"] = round(rss_kib(frontend.pid) / 1024, 1)
    return row


async def _fresh_frontend(cluster: BenchCluster, entries: int) -> tuple[Service, float]:
    """Start a frontend; seconds from spawning it until ``/v1/models`` lists ``entries``."""
    started = time.perf_counter()
    service = cluster.frontend(wait=False)
    return service, await wait_listing(service, entries, started, READY_TIMEOUT_S)


def _stop(cluster: BenchCluster, service: Service) -> None:
    stop_services([service])
    cluster.services.remove(service)


def _text(results: dict[str, Any], _: argparse.Namespace) -> str:
    headers = [
        "instances", "cards", "ready s", "base-only ready s", "ready CPU s", "base-only CPU s",
        "registry ms", "RSS/card KiB",
        "route p50 µs", "route p99 µs", "/v1/models p50 ms", "p99 ms", "bytes", "lag p50 ms",
        "lag p99 ms", "changes/s", "unroutable", "revisions/s", "etcd MiB", "placement ms",
    ]  # fmt: skip
    keys = [
        "instances", "cards", "ready_s", "ready_base_s", "ready_cpu_s", "ready_base_cpu_s",
        "registry_build_ms", "rss_per_card_kib",
        "route_p50_us", "route_p99_us", "models_p50_ms", "models_p99_ms", "models_bytes",
        "lag_p50_ms", "lag_p99_ms", "changes_per_s", "unroutable", "revisions_per_s", "etcd_db_mib",
        "placement_ms",
    ]  # fmt: skip
    rows = [[row.get(key) for key in keys] for row in results["results"]]
    text = table(headers, rows)
    broken = [f"{row['instances']}x{row['cards']}: {row['broke']}"
              for row in results["results"] if "broke" in row]  # fmt: skip
    if broken:
        text += "\nbroke: " + "\n".join(broken)
    if results["settings"]["knee"]:
        text += f"\nfirst 10x slower: {results['knee'] or 'none'}"
        text += f"\nstopped: {results['broke'] or 'nothing broke'}"
    return text


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--instances", type=int, default=100, help="simulated instances")
    parser.add_argument("--cards", type=int, default=10_000,
                        help="adapter cards, spread round robin over the instances")  # fmt: skip
    parser.add_argument("--churn-per-s", type=float, default=50.0,
                        help="changes per second: an adapter unloaded on one instance, a new "
                        "one loaded on another")  # fmt: skip
    parser.add_argument("--churn-s", type=float, default=10.0, help="seconds of churn")
    parser.add_argument("--samples", type=int, default=200, help="timed GET /v1/models")
    parser.add_argument("--route-samples", type=int, default=20_000,
                        help="timed routing decisions")  # fmt: skip
    parser.add_argument("--lease-ttl-s", type=int, default=30,
                        help="lease TTL of each instance (all keep-alives share this process's "
                        "loop, busy with the churn)")  # fmt: skip
    parser.add_argument("--knee", action="store_true",
                        help="double instances and cards until something breaks or a figure "
                        "is 10x its value at the default shape")  # fmt: skip
    parser.add_argument("--knee-max-factor", type=int, default=16,
                        help="largest multiple of the default shape --knee tries")  # fmt: skip
    add_output_flags(parser)
    return parser


main: Final = benchmark_main(build_parser, run, _text)


if __name__ == "__main__":
    sys.exit(main())
