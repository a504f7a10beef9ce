"""The worker's name for ``fleet.adapter_files``: the reader of adapter directories moved
there so that the frontend checks a visible ``file://`` path with the same rules."""

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

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "ALLOW_PICKLE_VARIABLE",
    "adapter_bytes",
    "adapter_problem",
    "check_adapter_rank",
    "pickle_problem",
    "read_adapter_config",
]
