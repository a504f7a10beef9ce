"""Prefix-aware routing: the index of the workers' KV blocks, its events, and the router."""

from lorafleet.frontend.kv.prefix_index import DEFAULT_MAX_BLOCKS, PrefixIndex
from lorafleet.frontend.kv.prefix_memory import PrefixMemory
from lorafleet.frontend.kv.prefix_router import PrefixRouter
from lorafleet.frontend.kv.prompt_blocks import HfTokenizers, PromptBlocks
from lorafleet.frontend.kv.recent_sends import RecentSends
from lorafleet.frontend.kv.routing_metrics import RoutingMetrics

__all__ = [
    "DEFAULT_MAX_BLOCKS",
    "HfTokenizers",
    "PrefixIndex",
    "PrefixMemory",
    "PrefixRouter",
    "PromptBlocks",
    "RecentSends",
    "RoutingMetrics",
]
