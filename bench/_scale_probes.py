"""The measurements of ``bench.scale``: start-up, RSS, routing, churn lag, etcd, placement.

Each probe takes what it measures (a frontend's port and pid, a simulated
fleet, an etcd client) and returns plain figures; ``bench.scale`` runs them in order.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Final

from bench._cluster import Service
from bench._fleet import SimulatedFleet, SimulatedInstance
from bench._http import HttpConnection, build_request
from bench._report import ms, percentile
from bench.plan_copies import time_changes
from lorafleet.discovery.client import EtcdClient
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.frontend.router import make_router

__all__ = [
    "Cards",
    "churn",
    "cpu_s",
    "etcd_status",
    "placement_per_change",
    "rss_kib",
    "routing_decisions",
    "wait_listing",
]

POPULATE_CONCURRENCY: Final = 32
READY_POLL_S: Final = 0.01
LAG_POLL_S: Final = 0.001
LAG_TIMEOUT_S: Final = 10.0
"""A change not routable after this long is counted as ``unroutable`` (and not as a lag)."""
REVISION_PROBE_KEY: Final = b"\x00bench-scale-revision"
"""A key nobody writes: reading it returns etcd's current revision."""
PICK_ROUTER: Final = "least-inflight"
"""Whose pick is timed: the default ``prefix`` router picks this way once a request's prompt is
scored (its prompt's own cost is ``bench.prefix_router_cost``'s), and adapters go this way
under every other router."""
PLACEMENT_ROUNDS: Final = 3
"""Timed passes per kind of change (medians)."""


@dataclass
class Cards:
    """Which adapter each simulated instance has loaded, and the next fresh name."""

    fleet: SimulatedFleet
    on: dict[str, SimulatedInstance] = field(default_factory=dict)
    serial: itertools.count[int] = field(default_factory=itertools.count)

    def fresh(self) -> str:
        """A name never loaded before."""
        return f"scale-{next(self.serial):06d}"

    async def populate(self, total: int) -> float:
        """Load ``total`` adapters round robin over the instances; returns the seconds."""
        started = time.perf_counter()
        gate = asyncio.Semaphore(POPULATE_CONCURRENCY)
        instances = self.fleet.instances

        async def one(index: int) -> None:
            async with gate:
                await self.load(self.fresh(), instances[index % len(instances)])

        await asyncio.gather(*(one(index) for index in range(total)))
        return time.perf_counter() - started

    async def load(self, name: str, instance: SimulatedInstance) -> None:
        """Load ``name`` on ``instance`` (publishing its card)."""
        await instance.load(name)
        self.on[name] = instance

    def pick(self, rng: random.Random) -> tuple[str, SimulatedInstance]:
        """Take a loaded adapter out of the books (half the time the oldest) to move it."""
        name = rng.choice(list(self.on)) if rng.random() < 0.5 else next(iter(self.on))
        return name, self.on.pop(name)


def rss_kib(pid: int) -> int:
    """Resident set size of process ``pid`` in KiB (``VmRSS`` in /proc)."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used (user and system, from /proc): what start-up
    costs, whatever the load of the machine does to its wall time."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_listing(service: Service, entries: int, since: float, timeout_s: float) -> float:
    """Seconds from ``since`` until the frontend's ``/v1/models`` lists ``entries`` entries.

    Raises with the end of the frontend's log if it exits or times out first.
    """
    port = service.port
    raw = build_request("GET", "127.0.0.1", port, "/v1/models")
    deadline = since + timeout_s
    while time.perf_counter() < deadline:
        try:
            connection = await HttpConnection.open("127.0.0.1", port)
        except OSError:
            if service.process.poll() is not None:
                raise RuntimeError(f"the frontend exited: {_first_error(service)}") from None
            await asyncio.sleep(READY_POLL_S)  # not listening yet: poll, it has no event to wait on
            continue
        try:
            while time.perf_counter() < deadline:
                body = (await connection.request(raw)).body
                if body.count(b'"object":"model"') >= entries:
                    return time.perf_counter() - since
                await asyncio.sleep(READY_POLL_S)
        finally:
            await connection.close()
    raise TimeoutError(
        f"/v1/models did not list {entries} entries within {timeout_s} s: {_first_error(service)}"
    )


def _first_error(service: Service) -> str:
    """The frontend's first warning or error line (its log: the cause), or that there was none."""
    lines = [line for line in service.log_tail(200).splitlines()
             if "[error" in line or "[warning" in line]  # fmt: skip
    return lines[0].strip() if lines else "no error in its log"


def routing_decisions(registry: ModelRegistry, model: str, samples: int) -> dict[str, Any]:
    """µs per routing decision (registry lookup + router pick) on a registry built from etcd.

    The frontend's own ``ModelRegistry`` over real watch caches, and the least-inflight
    pick among a name's instances (``PICK_ROUTER``), for the base model (a tenth of the
    picks) and the adapters.
    """
    names = registry.names()
    router = make_router(PICK_ROUTER)
    rng = random.Random(0)
    picks = [model if i % 10 == 0 else rng.choice(names) for i in range(samples)]
    durations = []
    for name in picks:
        begun = time.perf_counter()
        served = registry.get(name)
        assert served is not None
        router.pick(served.name, served.instances, ())
        durations.append(time.perf_counter() - begun)
    return {
        "route_p50_us": _us(percentile(durations, 0.5)),
        "route_p99_us": _us(percentile(durations, 0.99)),
    }


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e6, 1)


async def churn(cards: Cards, port: int, per_s: float, duration_s: float) -> dict[str, Any]:
    """Move adapters at ``per_s`` changes/s: unload one, load a fresh name elsewhere.

    Lag is from the start of the load call (the put is sent) until
    ``GET /v1/models/{name}`` on the frontend answers 200, polled every ``LAG_POLL_S``.
    """
    instances = cards.fleet.instances
    rng = random.Random(1)
    lags: list[float | None] = []
    tasks = []
    started = time.perf_counter()
    for step in range(int(per_s * duration_s)):
        await asyncio.sleep(max(0.0, started + step / per_s - time.perf_counter()))
        old, source = cards.pick(rng)
        target = rng.choice([i for i in instances if i is not source] or instances)
        tasks.append(asyncio.create_task(_move(cards, (old, source), target, port, lags)))
    await asyncio.gather(*tasks)
    elapsed_s = time.perf_counter() - started
    routable = [lag for lag in lags if lag is not None]
    return {
        "changes": len(tasks),
        "changes_per_s": round(len(tasks) / elapsed_s, 1),
        "unroutable": len(lags) - len(routable),
        "lag_p50_ms": ms(percentile(routable, 0.5)),
        "lag_p99_ms": ms(percentile(routable, 0.99)),
        "lag_max_ms": ms(max(routable, default=None)),
    }


async def _move(
    cards: Cards,
    old: tuple[str, SimulatedInstance],
    target: SimulatedInstance,
    port: int,
    lags: list[float | None],
) -> None:
    """One change: ``old`` leaves its instance, a fresh adapter arrives on ``target``."""
    name = cards.fresh()
    raw = build_request("GET", "127.0.0.1", port, f"/v1/models/{name}")
    connection = await HttpConnection.open("127.0.0.1", port)
    try:
        await old[1].unload(old[0])
        written = time.perf_counter()
        await cards.load(name, target)
        deadline = written + LAG_TIMEOUT_S
        while (await connection.request(raw)).status != 200:
            if time.perf_counter() > deadline:
                lags.append(None)
                return
            await asyncio.sleep(LAG_POLL_S)  # the frontend has no event to offer us: poll
        lags.append(time.perf_counter() - written)
    finally:
        await connection.close()


async def etcd_status(etcd: EtcdClient) -> tuple[int, int]:
    """etcd's current revision (an empty range read's header) and database size in bytes
    (maintenance ``Status``)."""
    with etcd.errors("status"):
        status = await etcd.status()
        listing = await etcd.get_prefix(REVISION_PROBE_KEY)
    return int(listing.header.revision), int(status.db_size)


def placement_per_change(instances: int, adapters: int) -> dict[str, Any]:
    """ms one worker spends on a placement pass after a change (``fleet.placement.plan_copies``).

    The worst of the changes ``bench.plan_copies`` times (an instance joins or leaves, 100
    adapters get a copy more), on a settled plan with the worker's rendezvous cache warm;
    adapters want 1 to 3 copies and every instance has twice the slots they need.
    """
    slots_each = max(1, math.ceil(2 * 1.6 * adapters / instances))  # 1.6: mean copies wanted
    rows = time_changes(instances=instances, slots_each=slots_each, adapters=adapters,
                        rounds=PLACEMENT_ROUNDS, seed=15)  # fmt: skip
    changes = [row for row in rows if row["cpu_ms"] is not None]
    worst = max(changes, key=lambda row: row["ms"])
    return {
        "placement_ms": worst["ms"],
        "placement_cpu_ms": worst["cpu_ms"],
        "placement_change": worst["change"],
        "placement_first_pass_ms": rows[0]["ms"],
    }
