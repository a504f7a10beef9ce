"""What the vllm engine hands to vLLM, checked without vLLM installed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from lorafleet.proto.errors import InvalidRequestError
from lorafleet.proto.inference import SamplingParams, TokenLogprob, TopLogprob
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines._vllm_settings import (
    engine_kwargs,
    finish_reason,
    sampling_kwargs,
    token_logprobs,
    vllm_lora_rank,
)


def test_lora_settings_come_from_the_config_and_every_loaded_adapter_fits_the_cache() -> None:
    kwargs = engine_kwargs(EngineConfig(model="m", enable_lora=True, max_loras=3, max_lora_rank=16))
    assert kwargs["enable_lora"] is True
    assert kwargs["max_loras"] == kwargs["max_cpu_loras"] == 3
    assert kwargs["max_lora_rank"] == 16


def test_without_lora_no_lora_settings_reach_vllm() -> None:
    assert "enable_lora" not in engine_kwargs(EngineConfig(model="m"))


def test_options_pass_through_and_override_except_lorafleets_own() -> None:
    options = {"enforce_eager": True, "max_model_len": 128, "isolate_base_rows": False,
               "mask_base_rows": True}  # fmt: skip
    kwargs = engine_kwargs(EngineConfig(model="m", served_model_name="chat", options=options))
    assert kwargs["enforce_eager"] is True
    assert kwargs["max_model_len"] == 128
    assert kwargs["served_model_name"] == "chat"
    assert "isolate_base_rows" not in kwargs and "mask_base_rows" not in kwargs


def test_context_length_is_capped_at_what_a_local_model_allows(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    short = engine_kwargs(EngineConfig(model=str(tmp_path), context_length=256))
    capped = engine_kwargs(EngineConfig(model=str(tmp_path), context_length=2048))
    assert (short["max_model_len"], capped["max_model_len"]) == (256, 512)


@pytest.mark.parametrize(("asked", "given"), [(1, 1), (4, 8), (8, 8), (64, 64), (100, 128)])
def test_lora_rank_rounds_up_to_one_vllm_accepts(asked: int, given: int) -> None:
    assert vllm_lora_rank(asked) == given


def test_lora_rank_beyond_vllms_largest_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="1024"):
        vllm_lora_rank(1024)


def test_sampling_settings_are_forwarded() -> None:
    sampling = SamplingParams(
        max_tokens=7, temperature=0.0, top_p=0.9, stop=["!"], seed=3, logprobs=2,
        presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2,
        ignore_eos=True, min_tokens=4, logit_bias={11: -100.0},
    )  # fmt: skip
    assert sampling_kwargs(sampling) == {
        "max_tokens": 7, "temperature": 0.0, "top_p": 0.9, "stop": ["!"], "seed": 3,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2,
        "logprobs": 2, "ignore_eos": True, "min_tokens": 4, "logit_bias": {11: -100.0},
    }  # fmt: skip


def test_no_logit_bias_is_forwarded_as_none() -> None:
    assert sampling_kwargs(SamplingParams())["logit_bias"] is None


@dataclass(frozen=True)
class _Logprob:
    """vLLM's ``Logprob`` as its outputs carry it (vLLM is not installed in this venv)."""

    logprob: float
    rank: int | None
    decoded_token: str | None


def test_vllm_logprobs_become_the_wire_shape_with_top_by_rank() -> None:
    # Token 7 was sampled at rank 3, outside the top 2: it is reported, not listed in top.
    candidates = {
        7: _Logprob(-2.0, 3, " c"),
        5: _Logprob(-0.5, 1, " a"),
        6: _Logprob(-1.0, 2, " b"),
    }
    (scored,) = token_logprobs([7], [candidates], top=2)
    assert scored == TokenLogprob(
        token=" c", logprob=-2.0,
        top=[TopLogprob(token=" a", logprob=-0.5), TopLogprob(token=" b", logprob=-1.0)],
    )  # fmt: skip
    assert token_logprobs([7], None, top=2) == []


def test_every_token_of_a_multi_token_delta_gets_its_logprobs() -> None:
    # A delta of several tokens: each keeps the caller's top, not the previous token's list.
    first = {4: _Logprob(-0.1, 1, " x"), 8: _Logprob(-3.0, 2, " y")}
    second = {9: _Logprob(-0.2, 1, " z"), 3: _Logprob(-2.5, 2, " w")}
    scored = token_logprobs([4, 9], [first, second], top=1)
    assert [item.token for item in scored] == [" x", " z"]
    assert [item.top for item in scored] == [
        [TopLogprob(token=" x", logprob=-0.1)],
        [TopLogprob(token=" z", logprob=-0.2)],
    ]


def test_zero_max_tokens_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        sampling_kwargs(SamplingParams(max_tokens=0))


@pytest.mark.parametrize(
    ("vllm", "wire"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("abort", "cancelled"),
        (None, "error"),
        ("x", "error"),
    ],
)
def test_finish_reasons_map_onto_the_wire(vllm: str | None, wire: str) -> None:
    assert finish_reason(vllm) == wire
