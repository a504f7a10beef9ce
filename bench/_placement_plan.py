"""What ``bench.placement`` gives each policy: the Zipf request plan, the desired specs, the flags.

The plan is seeded, so every policy answers the same requests in the same
order. The policies differ only in the adapters' replica bounds and the
workers' ``--placement-policy``; everything else (slots, load time, time per
token) is the same.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

from bench._http import build_request
from bench._open_loop import Planned

__all__ = [
    "BASE_TAG",
    "MODEL",
    "POLICIES",
    "Shape",
    "adapter_name",
    "declared_copies",
    "fair_copy_rps",
    "replica_bounds",
    "request_plan",
    "request_tags",
    "worker_flags",
    "zipf_ranks",
]

MODEL: Final = "demo"
PROMPT: Final = "tell me a story"
BASE_TAG: Final = -1
"""The tag of a request for the base model (adapters are tagged by popularity rank, 0 first)."""
WARM_PROBE_EVERY: Final = 10
"""One request in ten asks for the base model, loaded everywhere: the warm reference."""
POLICIES: Final = ("bounded", "rendezvous", "on-demand")
_WORKER_POLICY: Final = {"bounded": "bounded", "rendezvous": "rendezvous", "on-demand": "bounded"}
"""Workers' ``--placement-policy`` per policy (on-demand: the new fleet with no copies declared)."""


@dataclass(frozen=True, kw_only=True)
class Shape:
    """The fleet and the load: workers, adapter slots per worker, adapters, request shape.

    Examples::

        Shape(workers=8, slots=4, adapters=100)     # the default: 32 slots
        Shape(workers=2, slots=2, adapters=6)       # the smoke test's
    """

    workers: int
    slots: int
    adapters: int
    max_tokens: int = 8

    def __post_init__(self) -> None:
        if min(self.workers, self.slots, self.adapters, self.max_tokens) < 1:
            raise ValueError(f"every part of the shape must be at least 1: {self}")

    @property
    def total_slots(self) -> int:
        """Adapter slots of the whole fleet."""
        return self.workers * self.slots


def adapter_name(rank: int) -> str:
    """The adapter of popularity rank ``rank`` (0 is the most popular)."""
    return f"zipf-{rank:03d}"


def zipf_ranks(adapters: int, count: int, seed: int) -> list[int]:
    """``count`` ranks drawn from Zipf(1.0) over ``adapters``: rank ``k`` with weight 1/(k+1)."""
    weights = [1 / (rank + 1) for rank in range(adapters)]
    return random.Random(seed).choices(range(adapters), weights=weights, k=count)


def request_plan(shape: Shape, count: int, seed: int, port: int) -> list[Planned]:
    """``count`` streamed chat requests: every tenth for the base model, the rest Zipf-drawn."""

    def raw(model: str) -> bytes:
        body = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": shape.max_tokens, "stream": True}  # fmt: skip
        return build_request("POST", "127.0.0.1", port, "/v1/chat/completions", body)

    base = Planned(BASE_TAG, raw(MODEL))
    adapters = [Planned(rank, raw(adapter_name(rank))) for rank in range(shape.adapters)]
    return [base if tag == BASE_TAG else adapters[tag] for tag in request_tags(shape, count, seed)]


def request_tags(shape: Shape, count: int, seed: int) -> list[int]:
    """The plan's tags: ``BASE_TAG`` for every tenth request, a Zipf-drawn rank otherwise."""
    ranks = zipf_ranks(shape.adapters, count, seed)
    return [BASE_TAG if i % WARM_PROBE_EVERY == 0 else r for i, r in enumerate(ranks)]


def replica_bounds(policy: str, rank: int, shape: Shape) -> dict[str, int]:
    """The replica fields of the adapter of rank ``rank`` under ``policy``.

    ``rendezvous``: one copy each for the most popular half-the-slots adapters, the
    rest on demand. ``bounded``: the same adapters kept at one copy at least; demand
    may grow the top quarter-the-slots to 4 copies and every other adapter to 2.
    ``on-demand``: nothing placed.
    """
    placed = rank < shape.total_slots // 2
    if policy == "on-demand":
        return {"replicas": 0}
    if policy == "rendezvous":
        return {"replicas": int(placed)}
    hot = rank < shape.total_slots // 4
    return {"min_replicas": int(placed), "max_replicas": 4 if hot else 2}


def declared_copies(policy: str, shape: Shape) -> int:
    """Copies the policy keeps loaded whatever the demand (its adapters' lower bounds)."""
    bounds = [replica_bounds(policy, rank, shape) for rank in range(shape.adapters)]
    return sum(b.get("min_replicas", b.get("replicas", 0)) for b in bounds)


def fair_copy_rps(rate_rps: float, workers: int) -> float:
    """Adapter requests per second per worker at ``rate_rps`` offered: the workers'
    ``--lora-copy-rps`` by default. A copy that serves more than one worker's share makes
    its worker the busiest; demand adds a copy before that (at 70% of it)."""
    return rate_rps * (1 - 1 / WARM_PROBE_EVERY) / workers


def worker_flags(
    policy: str,
    shape: Shape,
    *,
    time_per_token_s: float,
    load_s: float,
    copy_rps: float | None = None,
) -> list[str]:
    """A mocker worker's flags; ``copy_rps``: its ``--lora-copy-rps`` (None: the default)."""
    flags = [
        "--enable-lora", "--max-loras", str(shape.slots),
        "--mocker-time-per-token-s", str(time_per_token_s),
        "--engine-option", f"add_adapter_delay_s={load_s}",
        "--placement-policy", _WORKER_POLICY[policy],
    ]  # fmt: skip
    if copy_rps is not None:
        flags += ["--lora-copy-rps", str(copy_rps)]
    return flags
