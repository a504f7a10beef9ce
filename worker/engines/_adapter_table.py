"""The vllm engine's table of loaded adapters: name to request handle, slots, in-flight requests.

No engine calls here: the engine asks the table what is allowed, then talks to
vLLM. Kept free of vLLM imports so the main test suite checks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from proto.errors import CapacityError, ConflictError, InvalidRequestError, NotFoundError

__all__ = ["AdapterHandle", "AdapterTable", "check_adapter_dir"]


def check_adapter_dir(name: str, path: Path, max_rank: int) -> None:
    """Refuse, before the engine tries, a directory that is no LoRA or whose rank is too big."""
    try:
        config = json.loads((path / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(
            f"adapter {name!r}: no readable adapter_config.json in {path}"
        ) from exc
    ranks = [config.get("r"), *dict(config.get("rank_pattern") or {}).values()]
    biggest = max((rank for rank in ranks if isinstance(rank, int)), default=0)
    if biggest > max_rank:
        raise InvalidRequestError(
            f"adapter {name!r} at {path} has rank {biggest}; this engine takes at most {max_rank}"
        )


class AdapterHandle(Protocol):
    """What the table needs of a loaded adapter (vLLM's ``LoRARequest`` fits)."""

    @property
    def lora_int_id(self) -> int:
        """The adapter's id inside the engine."""
        ...


H = TypeVar("H", bound=AdapterHandle)


class AdapterTable(Generic[H]):
    """Adapters by name with ``max_loras`` slots, and the requests running on each name.

    Example::

        table = AdapterTable(base_model="demo", max_loras=2)
        if not table.check_new("pirate", 7):
            table.put("pirate", handle)
        async with table.tracked("pirate", "req-1"):
            ...
    """

    def __init__(self, *, base_model: str, max_loras: int) -> None:
        self._base_model = base_model
        self._max_loras = max_loras
        self._handles: dict[str, H] = {}
        self._inflight: dict[str, set[str]] = {}
        self._changed = asyncio.Condition()

    def names(self) -> dict[str, int]:
        """Loaded adapters, sorted: name to id."""
        return {name: self._handles[name].lora_int_id for name in sorted(self._handles)}

    def check_new(self, name: str, lora_id: int) -> bool:
        """True if ``name`` is loaded already with ``lora_id``; raise if it cannot be added."""
        if name == self._base_model:
            raise InvalidRequestError(f"adapter {name!r} has the base model's name")
        loaded = self._handles.get(name)
        if loaded is not None:
            if loaded.lora_int_id == lora_id:
                return True
            raise ConflictError(f"adapter {name!r} is loaded with lora_id {loaded.lora_int_id}")
        for other, handle in self._handles.items():
            if handle.lora_int_id == lora_id:
                raise ConflictError(f"adapter {name!r}: lora_id {lora_id} is taken by {other!r}")
        if len(self._handles) >= self._max_loras:
            raise CapacityError(
                f"adapter {name!r}: all {self._max_loras} adapter slots are taken "
                f"by {sorted(self._handles)}; unload one first"
            )
        return False

    def put(self, name: str, handle: H) -> None:
        """Serve ``name`` through ``handle`` from now on."""
        self._handles[name] = handle

    def pop(self, name: str) -> H:
        """Stop resolving ``name`` (requests already running go on); raise if unknown."""
        handle = self._handles.pop(name, None)
        if handle is None:
            raise NotFoundError(f"adapter {name!r} is not loaded; loaded: {sorted(self._handles)}")
        return handle

    def resolve(self, model: str) -> H | None:
        """The handle for ``model``: None for the base model; raise if it is not served."""
        if model == self._base_model:
            return None
        handle = self._handles.get(model)
        if handle is None:
            raise NotFoundError(
                f"model {model!r} is not served here; base model {self._base_model!r}, "
                f"adapters {sorted(self._handles)}"
            )
        return handle

    @contextlib.asynccontextmanager
    async def tracked(self, model: str, request_id: str) -> AsyncIterator[None]:
        """Count ``request_id`` as running on ``model`` for the block."""
        self._inflight.setdefault(model, set()).add(request_id)
        try:
            yield
        finally:
            self._inflight[model].discard(request_id)
            async with self._changed:
                self._changed.notify_all()

    def running(self, model: str) -> list[str]:
        """Ids of the requests running on ``model`` now."""
        return sorted(self._inflight.get(model, ()))

    async def wait_idle(self, model: str, timeout_s: float) -> list[str]:
        """Wait up to ``timeout_s`` for ``model``'s requests to end; return those still running."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: not self._inflight.get(model)), timeout_s
                )
        return self.running(model)
