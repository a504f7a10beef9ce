"""How the fleet shares its adapters: the placement plan every worker and frontend computes
alike from the same records, and the one reader of adapter directories. Pure: no I/O but
reading those files."""

from lorafleet.fleet.adapter_files import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    ALLOW_PICKLE_VARIABLE,
    adapter_bytes,
    adapter_problem,
    check_adapter_rank,
    pickle_problem,
    read_adapter_config,
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

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "ALLOW_PICKLE_VARIABLE",
    "HELD_DEMAND_EPS",
    "IN_USE_RPS",
    "LOAD_BOUND_EPS",
    "RendezvousCache",
    "adapter_bytes",
    "adapter_problem",
    "check_adapter_rank",
    "chosen_instances",
    "may_drop_copy",
    "pickle_problem",
    "plan_copies",
    "read_adapter_config",
    "rendezvous_order",
    "wanted_copies",
]
