"""Start the prefix router of ``--router prefix`` or ``prefix-approx`` with what it reads.

``prefix`` follows the workers' KV events into an index (``KvEventsListener``) and falls back
to the approximate memory per instance; ``prefix-approx`` has the memory alone (the
benchmark's approximate router, and fleets whose engines publish no events).
"""

from __future__ import annotations

import contextlib

from lorafleet.discovery.nats_connection import NatsConnection
from lorafleet.frontend.kv.events_listener import KvEventsListener
from lorafleet.frontend.kv.prefix_index import PrefixIndex
from lorafleet.frontend.kv.prefix_memory import PrefixMemory
from lorafleet.frontend.kv.prefix_router import PrefixRouter
from lorafleet.frontend.kv.routing_metrics import RoutingMetrics
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.frontend.request_plane import RequestPlane

__all__ = ["start_prefix_router"]


async def start_prefix_router(
    mode: str,
    stack: contextlib.AsyncExitStack,
    *,
    connection: NatsConnection,
    plane: RequestPlane,
    registry: ModelRegistry,
    namespace: str,
    metrics: RoutingMetrics,
    load_weight: float,
    max_blocks: int,
) -> PrefixRouter:
    """The router of ``mode``; its listener (``prefix``) is closed by ``stack``."""
    memory = PrefixMemory()
    if mode == "prefix-approx":
        return PrefixRouter(metrics=metrics, cards=registry.card_on, memory=memory,
                            load_weight=load_weight)  # fmt: skip
    index = PrefixIndex(max_blocks=max_blocks)
    listener = await KvEventsListener.start(
        connection, plane, registry, namespace, index=index, memory=memory, metrics=metrics
    )
    metrics.follow_index(lambda: index.size, listener.followed)
    stack.push_async_callback(listener.aclose)
    return PrefixRouter(metrics=metrics, cards=registry.card_on, memory=memory, index=index,
                        follows=listener.follows, load_weight=load_weight)  # fmt: skip
