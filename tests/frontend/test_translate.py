"""OpenAI bodies to generate requests: what is forwarded, and what is refused by name."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from lorafleet.frontend.card_view import CardView
from lorafleet.frontend.errors import BadFieldError
from lorafleet.frontend.registry import ServedModel
from lorafleet.frontend.translate import chat_to_generate, completion_to_generate
from lorafleet.proto.discovery import Instance, ModelDeploymentCard
from lorafleet.proto.openai import ChatCompletionRequest, CompletionRequest

SERVED = ServedModel(
    name="demo",
    card=CardView.of(ModelDeploymentCard(display_name="demo", slug="demo_x", context_length=512)),
    instances=(Instance(namespace="n", component="c", endpoint="e", instance_id=1, subject="s"),),
)


def _chat(**fields: object) -> ChatCompletionRequest:
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi there"}], **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


def _completion(**fields: object) -> CompletionRequest:
    body = {"model": "demo", "prompt": "once upon", **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=CompletionRequest)


def test_sampling_parameters_are_forwarded() -> None:
    request = chat_to_generate(
        _chat(max_tokens=7, temperature=0.2, top_p=0.9, stop="END", seed=3), SERVED, "r1"
    )
    sampling = request.sampling
    assert (request.request_id, request.model) == ("r1", "demo")
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p) == (7, 0.2, 0.9)
    assert (sampling.stop, sampling.seed) == (["END"], 3)


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    request = chat_to_generate(_chat(max_tokens=7, max_completion_tokens=9), SERVED, "r")
    assert request.sampling.max_tokens == 9


def test_defaults_are_openai_s() -> None:
    assert completion_to_generate(_completion(), SERVED, "r").sampling.max_tokens == 16
    chat = chat_to_generate(_chat(), SERVED, "r").sampling
    assert (chat.max_tokens, chat.temperature, chat.top_p) == (512, 1.0, 1.0)


def test_text_parts_are_joined_and_null_content_is_empty() -> None:
    messages = [
        {"role": "system",
         "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
    ]  # fmt: skip
    request = chat_to_generate(_chat(messages=messages), SERVED, "r")
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "a\nb"),
        ("assistant", ""),
    ]


def test_a_one_element_prompt_list_is_the_prompt() -> None:
    assert completion_to_generate(_completion(prompt=["x y"]), SERVED, "r").prompt == "x y"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_chat(n=2), "n"),
        (_chat(stream_options={"include_usage": True}), "stream_options"),
        (_chat(max_tokens=513), "max_tokens"),
        (_chat(stop=["ok", ""]), "stop"),
        (_chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
         "messages[0].content[0].type"),
        (_completion(prompt=["a", "b"]), "prompt"),
        (_completion(echo=True), "echo"),
    ],
)  # fmt: skip
def test_unsupported_values_are_refused_naming_the_field(body, param: str) -> None:
    convert = (
        chat_to_generate if isinstance(body, ChatCompletionRequest) else completion_to_generate
    )
    with pytest.raises(BadFieldError) as caught:
        convert(body, SERVED, "r")
    assert caught.value.param == param
    assert param in caught.value.message


def test_a_chat_only_model_refuses_completions() -> None:
    card = CardView.of(ModelDeploymentCard(display_name="demo", slug="d", model_type=["chat"]))
    chat_only = ServedModel(name="demo", card=card, instances=SERVED.instances)
    with pytest.raises(BadFieldError, match="does not serve completions"):
        completion_to_generate(_completion(), chat_only, "r")


def test_penalties_and_logprobs_are_forwarded() -> None:
    chat = chat_to_generate(
        _chat(presence_penalty=0.5, frequency_penalty=-1, repetition_penalty=1.3, logprobs=True,
              top_logprobs=4),
        SERVED, "r",
    ).sampling  # fmt: skip
    assert (chat.presence_penalty, chat.frequency_penalty, chat.repetition_penalty) == (
        0.5, -1.0, 1.3,
    )  # fmt: skip
    assert chat.logprobs == 4
    assert chat_to_generate(_chat(logprobs=True), SERVED, "r").sampling.logprobs == 0
    assert chat_to_generate(_chat(), SERVED, "r").sampling.logprobs is None
    assert completion_to_generate(_completion(logprobs=2), SERVED, "r").sampling.logprobs == 2
    defaults = completion_to_generate(_completion(), SERVED, "r").sampling
    assert (defaults.presence_penalty, defaults.repetition_penalty) == (0.0, 1.0)


HF_SERVED = dataclasses.replace(
    SERVED,
    instances=(
        Instance(namespace="n", component="c", endpoint="e", instance_id=1, subject="s",
                 engine="hf"),
    ),
)  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        (_chat(tool_choice="required"), "tool_choice"),
        (_chat(tool_choice={"type": "function", "function": {"name": "f"}}), "tool_choice"),
        (_chat(response_format={"type": "json_schema"}), "response_format"),
        (_chat(n=3), "n"),
    ],
)
def test_what_no_engine_serves_is_refused_naming_the_field_and_engine(
    body: ChatCompletionRequest, param: str
) -> None:
    with pytest.raises(BadFieldError) as refused:
        chat_to_generate(body, HF_SERVED, "r")
    assert refused.value.param == param
    assert "'hf'" in refused.value.message


def test_harmless_tool_and_format_settings_are_accepted() -> None:
    for body in (_chat(tools=[]), _chat(tool_choice="none"), _chat(tool_choice="auto"),
                 _chat(response_format={"type": "text"})):  # fmt: skip
        assert chat_to_generate(body, HF_SERVED, "r").sampling.max_tokens == 512


def test_top_logprobs_needs_logprobs() -> None:
    with pytest.raises(BadFieldError) as refused:
        chat_to_generate(_chat(top_logprobs=2), SERVED, "r")
    assert refused.value.param == "top_logprobs"


def test_eos_and_bias_settings_are_forwarded() -> None:
    sampling = completion_to_generate(
        _completion(ignore_eos=True, min_tokens=4, logit_bias={"11": -100, "12": 5.5}), SERVED, "r"
    ).sampling
    assert (sampling.ignore_eos, sampling.min_tokens) == (True, 4)
    assert sampling.logit_bias == {11: -100.0, 12: 5.5}


def test_min_tokens_above_max_tokens_is_refused() -> None:
    with pytest.raises(BadFieldError) as refused:
        completion_to_generate(_completion(max_tokens=3, min_tokens=4), SERVED, "r")
    assert refused.value.param == "min_tokens"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_completion(best_of=2), "best_of"),
        (_completion(suffix="end"), "suffix"),
        (_chat(top_k=5), "top_k"),
        (_chat(store=True), "store"),
        (_chat(modalities=["text", "audio"]), "modalities"),
        (_chat(reasoning_effort="low"), "reasoning_effort"),
        (_chat(functions=[{"name": "f"}]), "functions"),
        (_completion(guided_json={"type": "object"}), "guided_json"),
    ],
)
def test_openai_and_vllm_fields_no_engine_serves_are_refused(body, param: str) -> None:
    convert = (
        chat_to_generate if isinstance(body, ChatCompletionRequest) else completion_to_generate
    )
    with pytest.raises(BadFieldError) as refused:
        convert(body, HF_SERVED, "r")
    assert refused.value.param == param
    assert param in refused.value.message and "'hf'" in refused.value.message


def test_neutral_values_of_unserved_fields_are_accepted() -> None:
    body = _completion(best_of=1, suffix="", top_k=-1, store=False, service_tier="auto",
                       skip_special_tokens=True, user="u1")  # fmt: skip
    assert completion_to_generate(body, HF_SERVED, "r").sampling.max_tokens == 16
