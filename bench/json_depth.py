"""What the JSON depth check costs a body, beside what decoding the same body costs.

``proto.limits.check_json_depth`` runs before msgspec on every JSON body of the
frontend and the worker. This times it on ordinary and crafted bodies of up to
10 MB (the frontend's body limit) and, where the body is within the limit, the
msgspec decode that follows. No servers: pure CPU in this process.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, Final

import msgspec

from bench._report import add_output_flags, benchmark_main, machine, percentile, table
from lorafleet.proto.errors import InvalidRequestError
from lorafleet.proto.limits import MAX_JSON_DEPTH, check_json_depth

MB: Final = 1_000_000


def _chat(turns: int) -> bytes:
    messages = [{"role": "user", "content": "tell me a story " * 20}] * turns
    return json.dumps({"model": "demo", "messages": messages, "max_tokens": 16}).encode()


def _blocks(depth: int, size: int) -> bytes:
    """Blocks ``[[...]]`` side by side in one array, ``depth`` levels in all: valid JSON."""
    block = b"[" * (depth - 1) + b"]" * (depth - 1)
    return b"[" + b",".join([block] * (size // (len(block) + 1))) + b"]"


BODIES: Final[dict[str, Callable[[], bytes]]] = {
    "chat, 10 turns": lambda: _chat(10),
    "chat, 4,096 turns": lambda: _chat(4096),
    "prompt of 10 MB": lambda: b'{"model": "demo", "prompt": "' + b"x" * 10 * MB + b'"}',
    "10 MB of [] pairs": lambda: b"[" + b"[]," * (10 * MB // 3) + b"[]]",
    f"10 MB of depth-{MAX_JSON_DEPTH} blocks": lambda: _blocks(MAX_JSON_DEPTH, 10 * MB),
    "10 MB of depth-6 blocks": lambda: _blocks(6, 10 * MB),
    f"10 MB of depth-{MAX_JSON_DEPTH + 1} blocks": lambda: _blocks(MAX_JSON_DEPTH + 1, 10 * MB),
    "10,000 deep": lambda: b"[" * 10_000 + b"]" * 10_000,
    "5,000,000 deep (10 MB)": lambda: b"[" * 5 * MB + b"]" * 5 * MB,
}


def _time(call: Callable[[], object], rounds: int) -> float | None:
    """Median seconds of ``rounds`` calls."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return percentile(times, 0.5)


def _refused(raw: bytes) -> bool:
    try:
        check_json_depth(raw)
    except InvalidRequestError:
        return True
    return False


def _measure(name: str, raw: bytes, rounds: int) -> dict[str, Any]:
    refused = _refused(raw)
    check_s = _time(lambda: _refused(raw), rounds)
    decode_s = None if refused else _time(lambda: msgspec.json.decode(raw), rounds)
    return {
        "body": name, "bytes": len(raw), "refused": refused,
        "check_ms": round((check_s or 0) * 1000, 2),
        "decode_ms": None if decode_s is None else round(decode_s * 1000, 2),
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every body of ``BODIES`` whose name contains ``--only`` (all by default)."""
    chosen = [name for name in BODIES if args.only in name]
    rows = [_measure(name, BODIES[name](), args.rounds) for name in chosen]
    return {"bench": "json_depth", "machine": machine(), "settings": vars(args), "results": rows}


def _text(results: dict[str, Any]) -> str:
    headers = ["body", "bytes", "refused", "check ms", "decode ms"]
    rows = [[r["body"], r["bytes"], r["refused"], r["check_ms"], r["decode_ms"]]
            for r in results["results"]]  # fmt: skip
    return f"medians of {results['settings']['rounds']} rounds\n" + table(headers, rows)


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(prog="python -m bench.json_depth", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="timed calls per body")
    parser.add_argument("--only", default="", help="only bodies whose name contains this")
    add_output_flags(parser)
    return parser


main: Final = benchmark_main(build_parser, run, lambda results, _: _text(results))


if __name__ == "__main__":
    sys.exit(main())
