"""Decides how the vllm engine keeps base-model rows off adapter weights, before vLLM starts.

Pure: it imports no vLLM, so the main test suite checks every case. The patch it
chooses lives in ``_vllm_cpu_masking``; the gate in ``_batch_groups``. Edit
``MASKED_VLLM_VERSIONS`` only after reading that release's CPU LoRA ops.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from lorafleet.proto.errors import InvalidRequestError

__all__ = [
    "BaseRowsPlan",
    "ISOLATE_OPTION",
    "MASKED_VLLM_VERSIONS",
    "MASKING_EXTENSION",
    "MASK_OPTION",
    "Switch",
    "base_rows_plan",
    "option_switch",
]

ISOLATE_OPTION: Final = "isolate_base_rows"
"""Option: the gate that lets base and adapter requests into vLLM only in turns."""
MASK_OPTION: Final = "mask_base_rows"
"""Option: the patch that masks base rows inside vLLM's CPU LoRA ops."""
MASKED_VLLM_VERSIONS: Final = frozenset({"0.32.0"})
"""vLLM releases whose CPU LoRA ops (``vllm/lora/ops/torch_ops``) the patch was checked on."""
MASKING_EXTENSION: Final = "lorafleet.worker.engines._vllm_cpu_masking.MaskedBaseRows"
"""vLLM's ``worker_extension_cls``: importing it in vLLM's worker process applies the patch."""

Switch = Literal["auto", "on", "off"]


@dataclass(frozen=True, kw_only=True)
class BaseRowsPlan:
    """What keeps base rows right: the patch inside vLLM's worker, the gate, or neither.

    Example::

        BaseRowsPlan(mask=True, gate=False)  # CPU, a checked vLLM: the default
        BaseRowsPlan(mask=False, gate=True)  # CPU, a vLLM release nobody checked
        BaseRowsPlan(mask=False, gate=False)  # GPU: its kernels skip base rows
    """

    mask: bool
    gate: bool


def option_switch(options: Mapping[str, Any], name: str) -> Switch:
    """Read option ``name``: ``"auto"`` unless set to a boolean."""
    value = options.get(name, "auto")
    if value == "auto":
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    raise InvalidRequestError(f"option {name} must be 'auto', true or false, got {value!r}")


def base_rows_plan(
    options: Mapping[str, Any], *, lora: bool, cpu: bool, vllm_version: str
) -> BaseRowsPlan:
    """The plan for an engine with ``options`` on this platform and vLLM release.

    ``auto`` masks where the bug lives (LoRA on, CPU) and the release is checked, and
    gates where it lives and the patch cannot apply (an unchecked release, or a
    ``worker_extension_cls`` of the user's own in the slot the patch needs).
    """
    masking, isolation = option_switch(options, MASK_OPTION), option_switch(options, ISOLATE_OPTION)
    affected = lora and cpu
    maskable = vllm_version in MASKED_VLLM_VERSIONS and "worker_extension_cls" not in options
    if masking == "on" and not (affected and maskable):
        raise InvalidRequestError(
            f"option {MASK_OPTION}=true needs LoRA on vLLM's CPU platform, a checked vLLM "
            f"({', '.join(sorted(MASKED_VLLM_VERSIONS))}; this is {vllm_version}) and no "
            f"worker_extension_cls option; use {ISOLATE_OPTION}=true instead"
        )
    mask = affected and maskable and masking != "off"
    gate = isolation == "on" or (isolation == "auto" and affected and not mask)
    return BaseRowsPlan(mask=mask, gate=gate)
