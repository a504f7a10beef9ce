"""OpenAI bodies to generate requests: what is forwarded, and what is refused by name."""

from __future__ import annotations

import msgspec
import pytest

from frontend.errors import BadFieldError
from frontend.registry import ServedModel
from frontend.translate import chat_to_generate, completion_to_generate
from proto.discovery import Instance, ModelDeploymentCard
from proto.openai import ChatCompletionRequest, CompletionRequest

SERVED = ServedModel(
    name="demo",
    card=ModelDeploymentCard(display_name="demo", slug="demo_x", context_length=512),
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
    card = ModelDeploymentCard(display_name="demo", slug="d", model_type=["chat"])
    chat_only = ServedModel(name="demo", card=card, instances=SERVED.instances)
    with pytest.raises(BadFieldError, match="does not serve completions"):
        completion_to_generate(_completion(), chat_only, "r")
