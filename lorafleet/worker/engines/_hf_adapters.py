"""The hf engine's handle of a loaded adapter: its name, id, files and peft's name for it.

The bookkeeping (slots, ids, collisions) is ``worker.lora_controller``'s; the
weights live in ``_hf_model.ModelHost``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Adapter"]


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
