"""The hf engine's penalties and log probabilities on hand-made logits, as vLLM applies them."""

from __future__ import annotations

import pytest
import torch

from proto.inference import SamplingParams
from worker.engines._hf_batch import Row, penalise, sample_token


def _row(prompt: list[int], output: list[int], **sampling: float) -> Row:
    return Row(prompt_ids=prompt, params=SamplingParams(**sampling), budget=16, output_ids=output)


def test_no_penalty_leaves_the_logits_alone() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0])
    row = _row([0], [1, 1])
    assert penalise(logits, row.params, row) is logits


def test_frequency_counts_each_time_and_presence_once() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    row = _row([3], [1, 1, 2], frequency_penalty=0.5, presence_penalty=0.25)
    got = penalise(logits, row.params, row)
    # token 1: twice (2 * 0.5 + 0.25); token 2: once (0.5 + 0.25); the prompt's token 3: none
    assert got.tolist() == pytest.approx([1.0, 0.75, 2.25, 4.0])


def test_repetition_divides_positive_and_multiplies_negative_logits_of_seen_tokens() -> None:
    logits = torch.tensor([2.0, -2.0, 2.0, 5.0])
    row = _row([0], [1], repetition_penalty=2.0)
    assert penalise(logits, row.params, row).tolist() == pytest.approx([1.0, -4.0, 2.0, 5.0])


def test_a_penalty_can_change_the_greedy_choice() -> None:
    logits = torch.tensor([0.0, 3.0, 2.5])
    row = _row([0], [1], temperature=0.0, frequency_penalty=1.0)
    assert sample_token(logits, row.params, None) == 1
    assert sample_token(penalise(logits, row.params, row), row.params, None) == 2
