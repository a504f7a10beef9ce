"""How long one placement pass takes per change, for a large fleet (issue 15: under 50 ms).

Times ``fleet.placement.plan_copies`` as every worker runs it on each change: the
same ``RendezvousCache`` across passes, the current copies as ``held``, Zipf(1.0)
demand. Default shape: 100 instances of 200 slots, 10,000 adapters of 1 to 3 copies. No servers:
pure CPU in this process; wall and CPU time are both reported (the CPU time
does not count other processes on a shared machine).
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import time
from collections.abc import Callable
from typing import Any, Final

from bench._report import add_output_flags, benchmark_main, machine, percentile, table
from lorafleet.fleet.placement import RendezvousCache, plan_copies

Plan = dict[str, list[int]]


def _held(plan: Plan) -> dict[int, set[str]]:
    held: dict[int, set[str]] = {}
    for name, where in plan.items():
        for iid in where:
            held.setdefault(iid, set()).add(name)
    return held


def _time(
    call: Callable[[], object], rounds: int, reset: Callable[[], object]
) -> tuple[float, float]:
    """Median wall and CPU milliseconds of ``rounds`` calls, each after an untimed ``reset``
    (so that every timed pass meets the change, not a cache that already saw it)."""
    walls, cpus = [], []
    for _ in range(rounds):
        reset()
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return (percentile(walls, 0.5) or 0) * 1000, (percentile(cpus, 0.5) or 0) * 1000


def time_changes(
    *, instances: int, slots_each: int, adapters: int, rounds: int, seed: int
) -> list[dict[str, Any]]:
    """Time the first pass, then each kind of change on the settled plan (ms wall and CPU)."""
    rng = random.Random(seed)
    slots = {rng.getrandbits(63): slots_each for _ in range(instances)}
    copies = {f"adapter-{i}": rng.choice([1, 1, 1, 2, 3]) for i in range(adapters)}
    demand = {name: 100 / rank for rank, name in enumerate(copies, start=1)}
    plan = functools.partial(plan_copies, demand=demand, cache=RendezvousCache())
    started = time.perf_counter()
    held = _held(plan(copies, slots))
    first_ms = (time.perf_counter() - started) * 1000
    newcomer, leaver = rng.getrandbits(63), next(iter(slots))
    hot = {name: n + 1 for name, n in list(copies.items())[:100]}
    settled = lambda: plan(copies, slots, held=held)  # noqa: E731
    changes: dict[str, Callable[[], object]] = {
        "nothing changed": settled,
        "an instance joins": lambda: plan(copies, {**slots, newcomer: slots_each}, held=held),
        "an instance leaves": lambda: plan(
            copies, {k: v for k, v in slots.items() if k != leaver}, held=held
        ),
        "100 adapters get a copy more": lambda: plan({**copies, **hot}, slots, held=held),
    }
    rows = [{"change": "first pass (every weight)", "ms": round(first_ms, 1), "cpu_ms": None}]
    for name, call in changes.items():
        wall_ms, cpu_ms = _time(call, rounds, reset=settled)
        rows.append({"change": name, "ms": round(wall_ms, 1), "cpu_ms": round(cpu_ms, 1)})
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Time the first pass, then each kind of change on the settled plan."""
    rows = time_changes(instances=args.instances, slots_each=args.slots, adapters=args.adapters,
                        rounds=args.rounds, seed=args.seed)  # fmt: skip
    return {"bench": "plan_copies", "machine": machine(), "settings": vars(args), "results": rows}


def _text(results: dict[str, Any]) -> str:
    settings = results["settings"]
    rows = [[r["change"], r["ms"], r["cpu_ms"]] for r in results["results"]]
    return (
        f"{settings['instances']} instances x {settings['slots']} slots, "
        f"{settings['adapters']} adapters; medians of {settings['rounds']} passes\n"
        + table(["change", "ms", "cpu ms"], rows)
    )


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(prog="python -m bench.plan_copies", description=__doc__)
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--slots", type=int, default=200, help="adapter slots per instance")
    parser.add_argument("--adapters", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=9, help="timed passes per change")
    parser.add_argument("--seed", type=int, default=15)
    add_output_flags(parser)
    return parser


main: Final = benchmark_main(build_parser, run, lambda results, _: _text(results))


if __name__ == "__main__":
    sys.exit(main())
