"""Routes each row of the hf engine's forward pass through its own adapter in every LoRA layer.

peft's mixed-batch forward (``adapter_names``) regroups the rows by adapter in
every LoRA layer on every call: Python comprehensions, index lists turned into
tensors twice, three module calls per adapter. On the demo model that was half
of a decode step, in the engine and in ``PeftModel.generate`` alike. Here the
rows are grouped once per forward pass (:meth:`LoraRouter.route`, and only when
the batch's adapters changed), and each plain LoRA linear layer runs a forward
of its own: per adapter in the batch, ``index_select`` of its rows, the two
matmuls, and one ``index_add_`` into the base layer's output; the same
arithmetic as peft's, in the same order, so the answers are the same bit for bit.

Layers that are not plain (DoRA and other variants, embeddings, convolutions,
merged weights, saved modules) keep peft's own forward and get the rows'
adapter names from a pre-hook, as ``PeftModel.forward`` would give them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.utils.other import AuxiliaryTrainingWrapper
from torch.nn import functional

__all__ = ["LoraRouter"]

Group = tuple[str, torch.Tensor | None]
"""An adapter's name and the indices of its rows in the batch (None: every row)."""
Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, float]
"""One adapter in one layer: A's weight (A has no bias), B's weight and bias, scaling."""


class LoraRouter:
    """Keeps every LoRA layer of a model told which rows of the running pass use which adapter."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._names: list[str] = []
        """Each row's adapter: read by peft's own forward through the pre-hooks."""
        self._groups: list[Group] = []
        """The rows of each adapter: read by the plain layers' forwards."""
        self._undo: list[Callable[[], None]] = []

    def route(self, names: list[str]) -> None:
        """Row ``i`` of the next forward passes uses adapter ``names[i]``."""
        if names == self._names:
            return
        self._names[:] = names
        self._groups = _group(names, self._device)

    def attach(self, model: torch.nn.Module) -> None:
        """(Re)wire every LoRA layer of ``model``; call after each adapter load or unload."""
        for undo in self._undo:
            undo()
        self._undo = []
        for module in model.modules():
            if type(module) is LoraLinear and (weights := _plain_weights(module)) is not None:
                self._undo.append(self._own_forward(module, weights))
            elif isinstance(module, LoraLayer | AuxiliaryTrainingWrapper):
                handle = module.register_forward_pre_hook(self._pass_names, with_kwargs=True)
                self._undo.append(handle.remove)

    def _pass_names(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        kwargs["adapter_names"] = self._names
        return args, kwargs

    def _own_forward(self, layer: LoraLinear, weights: dict[str, Weights]) -> Callable[[], None]:
        """Give ``layer`` a forward that reads the router's groups; return how to undo it."""
        base = layer.base_layer

        def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            result: torch.Tensor = base(x, *args, **kwargs)
            for name, rows in self._groups:
                if (found := weights.get(name)) is None:  # the base model, or not in this layer
                    continue
                a, b, bias, scaling = found
                part = x if rows is None else x.index_select(0, rows)
                delta = functional.linear(functional.linear(part.to(a.dtype), a), b, bias) * scaling
                if rows is None:
                    result += delta.to(result.dtype)
                else:
                    result.index_add_(0, rows, delta.to(result.dtype))
            return result

        layer.forward = forward  # type: ignore[method-assign]
        return lambda: delattr(layer, "forward")


def _plain_weights(layer: LoraLinear) -> dict[str, Weights] | None:
    """Each adapter's weights if all of ``layer``'s adapters are plain LoRA, else None.

    Dropout is left out: the engine's model is in eval mode, where it is the identity.
    """
    if layer.merged or layer.lora_variant or any(layer.use_dora.values()):
        return None
    weights: dict[str, Weights] = {}
    for key in layer.lora_A:
        a, b = layer.lora_A[key], layer.lora_B[key]
        if not isinstance(a, torch.nn.Linear) or not isinstance(b, torch.nn.Linear):
            return None
        weights[key] = (a.weight, b.weight, b.bias, float(layer.scaling[key]))
    return weights


def _group(names: list[str], device: torch.device) -> list[Group]:
    """Each adapter's rows, in order of first appearance."""
    rows: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        rows.setdefault(name, []).append(i)
    if len(rows) == 1:
        return [(names[0], None)]
    return [(name, torch.tensor(index, device=device)) for name, index in rows.items()]
