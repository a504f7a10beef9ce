"""The hf engine's adapter slots: which adapters are loaded or loading, and the limits on them.

Pure bookkeeping on the event loop; the weights themselves live in
``_hf_model.ModelHost``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from proto.errors import CapacityError, ConflictError, InvalidRequestError, NotFoundError
from worker.engines._hf_batch import BASE_ADAPTER

__all__ = ["Adapter", "AdapterTable", "check_adapter_files"]


@dataclass(frozen=True, kw_only=True)
class Adapter:
    """A loaded adapter: its public name, lora_id, files, and the name peft knows it by."""

    name: str
    lora_id: int
    path: Path

    @property
    def key(self) -> str:
        """peft's name for it, safe as a module name whatever the adapter is called."""
        return f"lora_{self.lora_id}"


class AdapterTable:
    """Loaded adapters by name plus names being loaded, within ``max_loras`` slots."""

    def __init__(self, *, base_name: str, max_loras: int) -> None:
        self.base_name = base_name
        self.max_loras = max_loras
        self.loaded: dict[str, Adapter] = {}
        self._loading: set[str] = set()

    def resolve(self, model: str) -> Adapter | None:
        """The adapter a request's ``model`` names; None for the base model."""
        if model == self.base_name:
            return None
        if model in self.loaded:
            return self.loaded[model]
        raise NotFoundError(
            f"model {model!r} is not served here; base model {self.base_name!r}, "
            f"adapters loaded: {sorted(self.loaded) or 'none'}"
        )

    def reserve(self, name: str, lora_id: int, path: Path) -> Adapter | None:
        """Take a slot for ``name``; None when it is already loaded from ``path``."""
        if name in (self.base_name, BASE_ADAPTER):
            raise InvalidRequestError(f"adapter name {name!r} is reserved for the base model")
        loaded = self.loaded.get(name)
        if loaded is not None:
            if loaded.path != path:
                raise ConflictError(f"adapter {name!r} is already loaded from {loaded.path}")
            return None
        if name in self._loading:
            raise ConflictError(f"adapter {name!r} is already being loaded")
        clash = [a.name for a in self.loaded.values() if a.lora_id == lora_id]
        if clash:
            raise ConflictError(f"adapter {name!r}: lora_id {lora_id} is taken by {clash[0]!r}")
        if len(self.loaded) + len(self._loading) >= self.max_loras:
            raise CapacityError(
                f"adapter {name!r}: all {self.max_loras} adapter slots are taken "
                f"(loaded: {sorted(self.loaded)})"
            )
        self._loading.add(name)
        return Adapter(name=name, lora_id=lora_id, path=path)

    def settle(self, adapter: Adapter, *, loaded: bool) -> None:
        """End a :meth:`reserve`: the adapter is now loaded, or its slot is free again."""
        self._loading.discard(adapter.name)
        if loaded:
            self.loaded[adapter.name] = adapter

    def pop(self, name: str) -> Adapter:
        """Remove ``name`` from the table (NotFoundError lists what is loaded)."""
        adapter = self.loaded.pop(name, None)
        if adapter is None:
            raise NotFoundError(
                f"adapter {name!r} is not loaded; loaded: {sorted(self.loaded) or 'none'}"
            )
        return adapter


def check_adapter_files(name: str, path: Path, max_rank: int) -> None:
    """Refuse ``path`` unless it holds a LoRA adapter config of rank at most ``max_rank``."""
    try:
        config = json.loads((path / "adapter_config.json").read_text())
        ranks = [int(config["r"]), *map(int, (config.get("rank_pattern") or {}).values())]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidRequestError(
            f"adapter {name!r}: {path} has no valid adapter_config.json ({exc})"
        ) from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise InvalidRequestError(f"adapter {name!r}: {path} is not a LoRA adapter")
    if max(ranks) > max_rank:
        raise InvalidRequestError(
            f"adapter {name!r}: rank {max(ranks)} exceeds max_lora_rank {max_rank}"
        )
