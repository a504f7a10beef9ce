"""Masks base-model rows inside vLLM's CPU LoRA ops, in vLLM's worker process.

vLLM's CPU punica ops (``vllm/lora/ops/torch_ops/lora_ops.py``) gather each row's
adapter weights with ``weights[indices]``; a base row's index is -1, which PyTorch
reads as the last slot, so base rows batched with adapter rows get that adapter's
delta (vllm-project/vllm issues 48421, 49656). The three ``bgmv_*`` ops are the only
ones that index (the ``sgmv_*`` ones expand indices per token and call them through
``lora_ops``'s globals); each is wrapped to zero the input rows whose index is
negative, so those rows get a zero delta, as the GPU kernels give by skipping them.

The vllm engine names :class:`MaskedBaseRows` as vLLM's ``worker_extension_cls``
(only on CPU, only for a release in ``MASKED_VLLM_VERSIONS``): vLLM's worker process
imports this module before it builds the model, and the import applies the patch;
the engine then asks each worker (``lorafleet_unmasked_modules``) whether it holds,
and gates base rows instead if not. Imported where vLLM is not loaded (the main
venv), it changes nothing.
Remove this module once vLLM's CPU ops skip negative indices themselves.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any, Final

__all__ = ["MaskedBaseRows", "capturing_modules", "mask_base_rows"]

_OPS_MODULE: Final = "vllm.lora.ops.torch_ops.lora_ops"
_CAPTURING_MODULES: Final = (
    _OPS_MODULE,
    "vllm.lora.ops.torch_ops",
    "vllm.lora.punica_wrapper.punica_cpu",
)
"""The modules of vLLM 0.32.0 that hold the ops by name (``from ... import``)."""
_INDEXING_OPS: Final = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_ORIGINAL: Final = "__lorafleet_unmasked__"
"""Attribute of a masked op: the op it wraps."""

_Op = Callable[..., None]


def _masked(op: _Op) -> _Op:
    """``op`` with the input rows of a negative index zeroed (a zero LoRA delta there)."""

    @functools.wraps(op)
    def masked_op(inputs: Any, weights: Any, output: Any, indices: Any, *args: Any,
                  **kwargs: Any) -> None:  # fmt: skip
        keep = (indices >= 0).unsqueeze(-1).to(inputs.dtype)
        op(inputs * keep, weights, output, indices, *args, **kwargs)

    setattr(masked_op, _ORIGINAL, op)
    return masked_op


def _originals() -> dict[str, _Op]:
    """The unmasked ops, whether or not the patch ran."""
    ops = sys.modules[_OPS_MODULE]
    return {
        name: getattr(getattr(ops, name), _ORIGINAL, getattr(ops, name)) for name in _INDEXING_OPS
    }


def capturing_modules() -> list[str]:
    """Loaded modules whose globals still hold an unmasked op; empty once the patch holds."""
    originals = set(map(id, _originals().values()))
    return sorted(
        name for name, module in list(sys.modules.items())
        if any(id(value) in originals for value in _globals(module).values())
    )  # fmt: skip


def _globals(module: object) -> dict[str, Any]:
    """A module's globals (a copy: importing elsewhere may change them meanwhile)."""
    return dict(getattr(module, "__dict__", {}))


def mask_base_rows() -> list[str]:
    """Replace the indexing ops by masked ones in every loaded module that holds them;
    return the modules that still hold an unmasked one (none when it worked)."""
    for name in _CAPTURING_MODULES:
        importlib.import_module(name)
    masked = {id(op): _masked(op) for op in _originals().values()}
    for name in [*_CAPTURING_MODULES, *capturing_modules()]:
        module = sys.modules[name]
        for attr, value in _globals(module).items():
            if id(value) in masked:
                setattr(module, attr, masked[id(value)])
    return capturing_modules()


class MaskedBaseRows:
    """vLLM ``worker_extension_cls``: its import masked the ops; the engine asks it to check."""

    def lorafleet_unmasked_modules(self) -> list[str]:
        """Modules of this worker process that still hold an unmasked op (none expected)."""
        return capturing_modules()


if "vllm" in sys.modules:  # imported by vLLM's worker process: patch before the model is built
    mask_base_rows()
