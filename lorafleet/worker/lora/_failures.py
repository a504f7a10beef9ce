"""Combine the failures of several sources for one URI into one error that keeps them all."""

from __future__ import annotations

from typing import Final

from lorafleet.worker.lora.errors import (
    LoraInvalidAdapterError,
    LoraInvalidUriError,
    LoraNotFoundError,
    LoraSourceError,
    LoraUnavailableError,
)

__all__ = ["combine_failures"]

# The class of the combined error: the first kind present, most worth retrying first.
_PRIORITY: Final[tuple[type[LoraSourceError], ...]] = (
    LoraUnavailableError,
    LoraInvalidAdapterError,
    LoraInvalidUriError,
    LoraNotFoundError,
)


def combine_failures(uri: str, failures: list[tuple[str, LoraSourceError]]) -> LoraSourceError:
    """Return one error for ``(source name, error)`` pairs; a single failure is returned as is."""
    if len(failures) == 1:
        return failures[0][1]
    errors = tuple(error for _, error in failures)
    kind = next(
        (cls for cls in _PRIORITY if any(isinstance(e, cls) for e in errors)), LoraUnavailableError
    )
    listed = "; ".join(
        f"[{n}] {name}: {error.reason} ({error.hint})"
        for n, (name, error) in enumerate(failures, start=1)
    )
    return kind(
        uri,
        f"all {len(failures)} sources failed: {listed}",
        hint="fix any one of them",
        failures=errors,
    )
