"""How the fleet shares its adapters: the placement plan every worker and frontend computes
alike from the same records, the judging of adapters' latency targets, and the one reader
of adapter directories. Pure: no I/O but reading those files."""

from lorafleet.fleet.adapter_files import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    ALLOW_PICKLE_VARIABLE,
    adapter_bytes,
    adapter_problem,
    check_adapter_rank,
    lora_rank,
    pickle_problem,
    read_adapter_config,
)
from lorafleet.fleet.adapter_fit import (
    RankCache,
    can_take,
    least_rank,
    unplaceable_reason,
)
from lorafleet.fleet.kv_blocks import (
    HASH_BYTES,
    block_hashes,
    chain_seed,
    version_key,
    words_tokens,
)
from lorafleet.fleet.placement import (
    HELD_DEMAND_EPS,
    IN_USE_RPS,
    LOAD_BOUND_EPS,
    RendezvousCache,
    chosen_instances,
    may_drop_copy,
    plan_copies,
    rendezvous_order,
    wanted_copies,
)
from lorafleet.fleet.safetensors_file import SAFETENSORS_HEADER_MAX_BYTES, safetensors_problem
from lorafleet.fleet.slo import (
    P95_SHARE,
    SETTLE_WINDOWS,
    attainment_of,
    merge_reports,
    miss_reason,
    next_slo_copies,
    p95_ms,
    slo_floor,
)

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "ALLOW_PICKLE_VARIABLE",
    "HASH_BYTES",
    "HELD_DEMAND_EPS",
    "IN_USE_RPS",
    "LOAD_BOUND_EPS",
    "P95_SHARE",
    "RankCache",
    "RendezvousCache",
    "SAFETENSORS_HEADER_MAX_BYTES",
    "SETTLE_WINDOWS",
    "adapter_bytes",
    "adapter_problem",
    "attainment_of",
    "block_hashes",
    "can_take",
    "chain_seed",
    "check_adapter_rank",
    "chosen_instances",
    "least_rank",
    "lora_rank",
    "may_drop_copy",
    "merge_reports",
    "miss_reason",
    "next_slo_copies",
    "p95_ms",
    "pickle_problem",
    "plan_copies",
    "read_adapter_config",
    "rendezvous_order",
    "safetensors_problem",
    "slo_floor",
    "unplaceable_reason",
    "version_key",
    "wanted_copies",
    "words_tokens",
]
