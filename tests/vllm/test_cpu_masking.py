"""The masked CPU LoRA ops: base rows (index -1) get no adapter delta, adapter rows theirs.

The ops are vLLM's own (``vllm.lora.ops.torch_ops``), called as vLLM's CPU punica
wrapper calls them, on small tensors in this process; no engine needed. Unpatched,
a -1 row gets the last slot's delta (vllm-project/vllm issues 48421, 49656).
"""

from __future__ import annotations

import sys

import pytest
import torch

from lorafleet.worker.engines._vllm_base_rows import MASKED_VLLM_VERSIONS
from lorafleet.worker.engines._vllm_cpu_masking import capturing_modules, mask_base_rows

SLOTS, RANK, HIDDEN = 3, 4, 8
INDICES = torch.tensor([-1, 0, 2, -1, 1])
"""Two base rows among rows of slots 0, 2 (the last) and 1."""


def _stacked(rows: int, columns: int) -> torch.Tensor:
    """Slot weights as vLLM stacks them: (slots, 1, rows, columns), each slot nonzero."""
    generator = torch.Generator().manual_seed(rows * 100 + columns)
    return torch.randn(SLOTS, 1, rows, columns, generator=generator)


def _punica_cpu_ops() -> dict:
    mask_base_rows()
    return vars(sys.modules["vllm.lora.punica_wrapper.punica_cpu"])


def _expected(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each row through its own slot's weights; a base row's delta is zero."""
    rows = [
        torch.zeros(weights.shape[2]) if slot < 0 else weights[slot, 0] @ x[row]
        for row, slot in enumerate(INDICES.tolist())
    ]
    return torch.stack(rows)


def test_bgmv_shrink_and_expand_give_base_rows_no_delta() -> None:
    ops = _punica_cpu_ops()
    x = torch.randn(len(INDICES), HIDDEN)
    lora_a, lora_b = _stacked(RANK, HIDDEN), _stacked(HIDDEN, RANK)
    shrunk = torch.zeros(len(INDICES), RANK)
    ops["bgmv_shrink"](x, lora_a, shrunk, INDICES, 1.0)
    torch.testing.assert_close(shrunk, _expected(x, lora_a))
    y = torch.ones(len(INDICES), HIDDEN)
    ops["bgmv_expand"](shrunk, lora_b, y, INDICES, True)
    torch.testing.assert_close(y, 1 + _expected(shrunk, lora_b))
    sliced = torch.ones(len(INDICES), 2 * HIDDEN)
    ops["bgmv_expand_slice"](shrunk, lora_b, sliced, INDICES, HIDDEN, HIDDEN, True)
    torch.testing.assert_close(sliced[:, HIDDEN:], 1 + _expected(shrunk, lora_b))
    torch.testing.assert_close(sliced[:, :HIDDEN], torch.ones(len(INDICES), HIDDEN))


def test_prefill_ops_mask_every_token_of_a_base_sequence() -> None:
    ops = _punica_cpu_ops()
    seq_lens = torch.tensor([2, 1, 2])
    per_sequence = torch.tensor([-1, 2, 0])  # a base prompt of 2 tokens first
    tokens = int(seq_lens.sum())
    x = torch.randn(tokens, HIDDEN)
    lora_a = _stacked(RANK, HIDDEN)
    shrunk = torch.zeros(tokens, RANK)
    starts = torch.tensor([0, 2, 3])
    ops["sgmv_shrink"](x, lora_a, shrunk, starts, seq_lens, per_sequence, 3, 2, tokens, 1.0)
    assert torch.count_nonzero(shrunk[:2]) == 0
    torch.testing.assert_close(shrunk[2], lora_a[2, 0] @ x[2])


def test_no_loaded_module_keeps_an_unmasked_op() -> None:
    mask_base_rows()
    assert capturing_modules() == []


def test_the_installed_vllm_is_one_the_patch_was_checked_on() -> None:
    import vllm
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("GPU kernels skip base rows: the patch is for vLLM's CPU ops only")
    assert vllm.__version__ in MASKED_VLLM_VERSIONS, (
        f"vllm {vllm.__version__}: read its vllm/lora/ops/torch_ops and punica_cpu.py, then add "
        "it to MASKED_VLLM_VERSIONS (or drop the patch if vLLM now skips -1 rows)"
    )
