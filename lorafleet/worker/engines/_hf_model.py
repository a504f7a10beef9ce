"""The hf engine's model: tokenizer, base weights, and the one PeftModel that holds every adapter.

Every method here blocks (disk, torch) and runs only on the engine's model
thread, never on the event loop.

A forward pass calls the transformers model (its LoRA layers injected by peft)
directly, not ``PeftModel.forward``: that one registers and removes a hook on
every LoRA layer, walking all modules twice, on every call, which cost the
decode loop about 15% of a step on the demo model. Here the LoRA layers stay
wired from adapter load to unload (``_hf_lora.LoraRouter``) and
:meth:`ModelHost.forward` only tells them each row's adapter.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import structlog
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from lorafleet.proto.errors import InvalidRequestError, UnavailableError
from lorafleet.worker.engines._hf_lora import LoraRouter

__all__ = ["ModelHost"]

log = structlog.get_logger(__name__)

_DTYPES: Final = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _pick_device(option: str) -> torch.device:
    if option == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(option)


def _pick_dtype(option: str, device: torch.device) -> torch.dtype | str:
    """float32 on CPU by default (fast and exact there), the checkpoint's dtype on a GPU."""
    if option == "auto":
        return "auto" if device.type != "cpu" else torch.float32
    if option not in _DTYPES:
        raise InvalidRequestError(f"hf engine: dtype {option!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[option]


class ModelHost:
    """Loads a causal LM and its tokenizer; adds and removes peft adapters in place."""

    def __init__(
        self, path: str, *, device: str = "auto", dtype: str = "auto", cpu_threads: int = 1
    ) -> None:
        self.device = _pick_device(device)
        if self.device.type == "cpu":
            # Small models gain nothing from intra-op threads, and on a busy machine
            # OpenMP barriers make two threads tens of times slower than one.
            torch.set_num_threads(cpu_threads)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.base = AutoModelForCausalLM.from_pretrained(
                path, dtype=_pick_dtype(dtype, self.device)
            )
        except (OSError, ValueError) as exc:
            raise UnavailableError(f"hf engine: cannot load model {path!r}: {exc}") from exc
        # transformers wraps Module.to with functools.wraps, which mypy binds without self.
        self.base.to(self.device).eval()  # type: ignore[arg-type]
        self.peft: PeftModel | None = None
        self._lora = LoraRouter(self.device)
        self.eos_ids = self._eos_ids()
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = min(self.eos_ids) if self.eos_ids else 0
        self.max_positions = int(getattr(self.base.config, "max_position_embeddings", 0) or 0)
        self.vocab_size = int(self.base.config.vocab_size)

    def forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor | None,
        positions: torch.Tensor,
        cache: DynamicCache,
        adapters: list[str],
    ) -> torch.Tensor:
        """One forward pass; the last position's logits. Row ``i`` uses adapter ``adapters[i]``.

        ``mask`` [rows, columns] marks the padding; None: there is none.
        """
        self._lora.route(adapters)
        out = self.base(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{_cache_kwarg(type(self.base).forward): cache},
        )
        logits: torch.Tensor = out.logits
        return logits

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (self.base.generation_config, self.base.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            ids.update(value if isinstance(value, list) else [] if value is None else [value])
        return frozenset(ids)

    def add_adapter(self, key: str, path: Path) -> None:
        """Load the peft adapter at ``path`` under peft name ``key``."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # peft calls deprecated transformers
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.base, str(path), adapter_name=key)
            else:
                self.peft.load_adapter(str(path), adapter_name=key)
        self.peft.to(self.device).eval()
        self._lora.attach(self.base)  # the new adapter may have wrapped more layers

    def remove_adapter(self, key: str) -> None:
        """Delete adapter ``key``; the last one unwraps the base model entirely."""
        if self.peft is None or key not in self.peft.peft_config:
            return
        if len(self.peft.peft_config) == 1:
            self.base = self.peft.unload()
            self.peft = None
            self._lora.attach(self.base)  # no LoRA layer left: forget the old ones
            return
        if self.peft.active_adapter == key:  # peft needs some active adapter, any other one
            self.peft.set_adapter(next(k for k in self.peft.peft_config if k != key))
        self.peft.delete_adapter(key)
        self._lora.attach(self.base)  # forget the adapter's weights

    def discard_partial(self, key: str) -> None:
        """Undo a failed :meth:`add_adapter` as far as peft got with it."""
        try:
            self.remove_adapter(key)
        except Exception:  # the adapter may never have been registered
            log.warning("hf.adapter.discard_failed", key=key, exc_info=True)


@functools.cache
def _cache_kwarg(forward: Callable[..., Any]) -> str:
    """``cache`` in recent transformers, ``past_key_values`` before it (per model class)."""
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params else "past_key_values"
