"""Figures for benchmarks: percentiles, CPU seconds per process, the table, the JSON, the loop.

``--json`` alone prints JSON on stdout (the table goes to stderr);
``--json PATH`` writes it to PATH and the table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, Protocol, TypeVar

import msgspec

__all__ = [
    "BenchmarkMain",
    "CpuMeter",
    "add_output_flags",
    "benchmark_main",
    "cpu_seconds",
    "emit",
    "machine",
    "median",
    "ms",
    "percentile",
    "run_async",
    "run_benchmark",
    "table",
]

_T = TypeVar("_T")
_CLOCK_TICKS_PER_S: Final = os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile (``fraction`` 0.5 is the median); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values present, rounded to 0.001 (None when none is)."""
    present = [value for value in values if value is not None]
    return round(statistics.median(present), 3) if present else None


def ms(seconds: float | None) -> float | None:
    """Seconds to milliseconds, rounded to 0.01 ms (None stays None)."""
    return None if seconds is None else round(seconds * 1000, 2)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds used so far by process ``pid`` (from /proc)."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        stat = handle.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S


class CpuMeter:
    """CPU seconds used by named groups of processes between ``start()`` and ``stop()``."""

    def __init__(self, groups: Mapping[str, Sequence[int]]) -> None:
        self.groups = {name: list(pids) for name, pids in groups.items()}
        self._before: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in self.groups.items()}

    def start(self) -> None:
        """Take the first reading."""
        self._before = self._now()

    def stop(self) -> dict[str, float]:
        """CPU seconds per group since ``start()``."""
        after = self._now()
        return {name: round(after[name] - self._before[name], 3) for name in after}


def machine() -> dict[str, Any]:
    """Where the figures were taken: CPUs, load averages, Python, time."""
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "load_avg_1_5_15": [round(value, 2) for value in load],
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """The ``--json [PATH]`` flag every benchmark takes."""
    parser.add_argument(
        "--json", nargs="?", const="-", default=None, metavar="PATH",
        help="machine-readable results: alone on stdout (table to stderr), or into PATH",
    )  # fmt: skip


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain text table, columns right-aligned."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def emit(results: Mapping[str, Any], text: str, json_target: str | None) -> None:
    """Print ``text`` and write ``results`` as JSON where ``--json`` asked."""
    encoded = msgspec.json.format(msgspec.json.encode(results), indent=2).decode()
    if json_target == "-":
        print(text, file=sys.stderr, flush=True)
        print(encoded, flush=True)
        return
    print(text, flush=True)
    if json_target is not None:
        with open(json_target, "w") as handle:
            handle.write(encoded + "\n")


def run_async(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a benchmark's coroutine on uvloop (as the frontend and workers do)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


Results = dict[str, Any]


def run_benchmark(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, Results] | Results],
    text: Callable[[Results, argparse.Namespace], str],
    argv: Sequence[str] | None,
) -> int:
    """Every benchmark's ``main``: parse ``argv``, run (a coroutine function, or a plain one
    for benchmarks without servers), print the table and ``--json``."""
    args = parser.parse_args(argv)
    outcome = run(args)
    results = run_async(outcome) if isinstance(outcome, Coroutine) else outcome
    emit(results, text(results, args), args.json)
    return 0


class BenchmarkMain(Protocol):
    """A benchmark module's ``main``: ``python -m bench.X`` calls it with no argument."""

    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


def benchmark_main(
    build_parser: Callable[[], argparse.ArgumentParser],
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, Results] | Results],
    text: Callable[[Results, argparse.Namespace], str],
) -> BenchmarkMain:
    """The ``main`` of a benchmark module: parse, run, print the table and ``--json``.

    Example: ``main = benchmark_main(build_parser, run, _text)``.
    """

    def main(argv: Sequence[str] | None = None) -> int:
        return run_benchmark(build_parser(), run, text, argv)

    main.__doc__ = "Run the benchmark and print (and optionally write) its figures."
    return main
