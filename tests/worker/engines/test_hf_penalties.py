"""The hf engine's penalties and log probabilities on hand-made logits, as vLLM applies them."""

from __future__ import annotations

import math
import random

import pytest
import torch

from lorafleet.proto.inference import SamplingParams
from lorafleet.worker.engines._hf_batch import Row, draw_plain, penalise, sample_token, steer


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
    assert sample_token(logits, row.params, row.rng) == 1
    assert sample_token(penalise(logits, row.params, row), row.params, row.rng) == 2


def test_rows_without_penalties_or_top_p_are_drawn_together_and_the_rest_left() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.5], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    rows = [
        _row([0], [], temperature=0.0),
        _row([0], [], temperature=1.0),
        _row([0], [], temperature=1.0, top_p=0.5),
    ]
    tokens = draw_plain(logits, rows)
    assert tokens[0] == 1 and tokens[1] in (0, 1, 2) and tokens[2] is None


def test_a_seeded_draw_repeats_and_never_picks_an_impossible_token() -> None:
    logits = torch.tensor([[-math.inf, 0.0, -math.inf, 0.0]] * 4)

    def draws(seed: int) -> list[int | None]:
        rows = [_row([0], [], temperature=1.0) for _ in range(4)]
        for row in rows:
            row.rng = random.Random(seed)
        return [t for _ in range(50) for t in draw_plain(logits, rows)]

    first = draws(7)
    assert first == draws(7)
    assert set(first) == {1, 3}  # both possible tokens come up, impossible ones never


def test_top_p_draws_only_from_the_nucleus() -> None:
    logits = torch.tensor([0.0, 4.0, 3.0, 0.0])  # token 1 alone holds most of the mass
    row = _row([0], [], temperature=1.0, top_p=0.5)
    assert {sample_token(logits, row.params, row.rng) for _ in range(50)} == {1}
    wide = _row([0], [], temperature=1.0, top_p=0.9)
    assert {sample_token(logits, wide.params, wide.rng) for _ in range(200)} == {1, 2}


def test_logit_bias_is_added_to_the_logits() -> None:
    row = _row([0], [], temperature=0.0)
    row.params = SamplingParams(temperature=0.0, logit_bias={0: 5.0, 2: -100.0})
    got = steer(torch.tensor([0.0, 3.0, 2.5]), row.params, row, frozenset())
    assert got.tolist() == pytest.approx([5.0, 3.0, -97.5])
    assert draw_plain(torch.tensor([[0.0, 3.0, 2.5]]), [row]) == [None]  # left to the slow path


def test_eos_is_banned_until_min_tokens_and_always_with_ignore_eos() -> None:
    logits = torch.tensor([0.0, 3.0, 2.5])
    early = Row(prompt_ids=[0], params=SamplingParams(min_tokens=2), budget=8, output_ids=[2])
    assert steer(logits, early.params, early, frozenset({1})).tolist()[1] == -math.inf
    early.output_ids.append(2)
    assert steer(logits, early.params, early, frozenset({1})) is logits
    ignoring = Row(prompt_ids=[0], params=SamplingParams(ignore_eos=True), budget=8,
                   output_ids=[2] * 5)  # fmt: skip
    assert steer(logits, ignoring.params, ignoring, frozenset({1})).tolist()[1] == -math.inf
