"""How the fleet shares its adapters: the placement plan every worker and frontend computes
alike from the same records. Pure: no I/O."""

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
    "HELD_DEMAND_EPS",
    "IN_USE_RPS",
    "LOAD_BOUND_EPS",
    "RendezvousCache",
    "chosen_instances",
    "may_drop_copy",
    "plan_copies",
    "rendezvous_order",
    "wanted_copies",
]
