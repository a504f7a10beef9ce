"""Which instances can take an adapter: its LoRA rank against each instance's ``max_lora_rank``.

Placement (every worker) and on-demand loads (every frontend) ask the same questions
with the same answers, so they send no load that an engine must refuse:

- **An instance's limit** is the ``max_lora_rank`` of its base card (0: it says none).
- **An adapter's rank** comes from its ``adapter_config.json`` when the source is a
  ``file://`` path this process can see (``RankCache``); otherwise it is learned from a
  refusal: an instance that answered ``adapter_rank_too_large`` for that source has a
  limit below the rank, so no instance with a limit as low can take it either
  (``least_rank``).

An adapter that no live instance of its base model can take is *unplaceable*: nobody
tries to load it, and ``/v1/adapters`` says why (``unplaceable_reason``). Pure but for
reading a visible ``adapter_config.json``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

from lorafleet.fleet.adapter_files import lora_rank, read_adapter_config
from lorafleet.proto.uris import split_uri

__all__ = ["RankCache", "can_take", "least_rank", "unplaceable_reason"]


def least_rank(visible: int, refused_limits: Iterable[int]) -> int:
    """The least rank the adapter can have: its files' (``visible``), or one above the highest
    limit that refused it, whichever is larger (0: nothing known, every instance may try)."""
    return max(visible, max((limit + 1 for limit in refused_limits), default=0))


def can_take(rank: int, limits: Mapping[int, int]) -> list[int]:
    """The instances (of ``limits``: id -> ``max_lora_rank``, 0 for none said) whose limit
    admits ``rank``, in the order given."""
    return [iid for iid, limit in limits.items() if limit == 0 or rank <= limit]


def unplaceable_reason(name: str, rank: int, limits: Mapping[int, int]) -> str:
    """Why no instance of ``limits`` (not empty) can take adapter ``name`` of ``rank``."""
    shown = ", ".join(str(limit) for limit in sorted(set(limits.values())))
    return (
        f"adapter {name!r} has rank {rank} or more; the live instances of its base model take "
        f"at most {shown} (--max-lora-rank): start a worker with a larger --max-lora-rank"
    )


class RankCache:
    """The rank of each adapter source whose files this process can see, read once per URI.

    Example::

        ranks = RankCache()
        ranks.rank("file:///adapters/sql")   # its adapter_config.json's r (or rank_pattern)
        ranks.rank("s3://bucket/sql")        # 0: not visible here; learned from refusals
    """

    def __init__(self) -> None:
        self._ranks: dict[str, int] = {}

    def rank(self, uri: str) -> int:
        """The largest rank ``uri``'s ``adapter_config.json`` declares; 0 when it is not a
        ``file://`` path that exists here or declares none (the engine's check decides)."""
        known = self._ranks.get(uri)
        if known is None:
            known = self._ranks[uri] = _visible_rank(uri)
        return known

    def retain(self, uris: Collection[str]) -> None:
        """Forget the sources no longer declared."""
        for uri in [uri for uri in self._ranks if uri not in uris]:
            del self._ranks[uri]


def _visible_rank(uri: str) -> int:
    parts = split_uri(uri)
    if parts is None or parts[0] != "file":
        return 0
    try:
        return lora_rank(read_adapter_config(Path(parts[1])))
    except (OSError, ValueError):
        return 0
