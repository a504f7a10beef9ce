"""What ``bench.failover`` runs on each engine: worker flags, the victim's adapter, the stream.

The mocker needs no model and numbers its tokens; the hf engine runs the demo
model, whose greedy answer to ``Who are you?`` is known, so a migrated stream
can be held against the unmigrated answer on a real model too.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Final

from bench._cluster import BenchCluster
from lorafleet.launch.demo_model import EXPECTED_PROMPT, ensure_demo_model

__all__ = ["ENGINES", "FailoverEngine", "failover_engine"]

ENGINES: Final = ("mocker", "hf")
MOCKER_PROMPT: Final = "tell me a story"
HF_MAX_TOKENS: Final = 64
"""More than the demo model's greedy answer needs: it ends with ``stop``."""


@dataclass(frozen=True, kw_only=True)
class FailoverEngine:
    """How to start a worker of one engine, and the chat request every stream sends."""

    engine: str
    model: str
    """The worker's ``--model``."""
    worker_args: tuple[str, ...]
    adapter_uri: str
    """What the victim loads as its own adapter."""
    stream_body: dict[str, Any]
    """The streamed chat request, without ``stream`` and ``stream_options``."""


def failover_engine(
    args: argparse.Namespace, cluster: BenchCluster, model: str, adapter: str
) -> FailoverEngine:
    """The setup for ``args.engine``; ``model`` is the served name, ``adapter`` the victim's."""
    if args.engine == "hf":
        demo = ensure_demo_model()
        return FailoverEngine(
            engine="hf", model=str(demo.base), worker_args=("--served-model-name", model),
            adapter_uri=f"file://{demo.adapters['pirate']}",
            stream_body=_chat(model, EXPECTED_PROMPT, HF_MAX_TOKENS, temperature=0),
        )  # fmt: skip
    return FailoverEngine(
        engine="mocker", model=model,
        worker_args=("--mocker-time-per-token-s", str(args.time_per_token_s)),
        adapter_uri=cluster.adapter(adapter),
        stream_body=_chat(model, MOCKER_PROMPT, args.stream_max_tokens),
    )  # fmt: skip


def _chat(model: str, prompt: str, max_tokens: int, **sampling: float) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens, **sampling}
