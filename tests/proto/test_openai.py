"""OpenAI bodies: what clients send decodes (extra fields too); constraints name the field."""

from __future__ import annotations

import msgspec
import pytest

from lorafleet.proto.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelList,
    ModelObject,
    OpenAIError,
    OpenAIErrorResponse,
)


def _chat(**fields: object) -> bytes:
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.json.encode(body)


def test_fields_openai_clients_send_that_we_do_not_use_are_accepted() -> None:
    body = msgspec.json.decode(
        _chat(presence_penalty=0.5, logit_bias={"1": 2}, tools=[], parallel_tool_calls=False),
        type=ChatCompletionRequest,
    )
    assert body.model == "demo"
    assert body.messages[0].content == "hi"


def test_text_parts_and_stop_lists_decode() -> None:
    raw = msgspec.json.encode(
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
         "stop": ["x", "y"], "stream": True, "stream_options": {"include_usage": True}}
    )  # fmt: skip
    body = msgspec.json.decode(raw, type=ChatCompletionRequest)
    assert body.stop == ["x", "y"]
    assert body.stream_options is not None and body.stream_options.include_usage


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"max_tokens": -1}, "$.max_tokens"),
        ({"max_tokens": 0}, "$.max_tokens"),
        ({"temperature": 2.5}, "$.temperature"),
        ({"top_p": 0}, "$.top_p"),
        ({"messages": "hello"}, "$.messages"),
        ({"messages": []}, "$.messages"),
        ({"model": ""}, "$.model"),
    ],
)
def test_out_of_range_fields_are_refused_naming_the_field(fields: dict, where: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=rf"at `\{where}`"):
        msgspec.json.decode(_chat(**fields), type=ChatCompletionRequest)


def test_completion_prompt_is_a_string_or_a_list_of_strings() -> None:
    one = msgspec.json.decode(b'{"model": "m", "prompt": "hi"}', type=CompletionRequest)
    listed = msgspec.json.decode(b'{"model": "m", "prompt": ["hi"]}', type=CompletionRequest)
    assert (one.prompt, listed.prompt) == ("hi", ["hi"])
    with pytest.raises(msgspec.ValidationError, match="prompt"):
        msgspec.json.decode(b'{"model": "m", "prompt": 7}', type=CompletionRequest)


def test_model_list_has_openai_and_vllm_fields() -> None:
    listing = ModelList(data=[ModelObject(id="pirate", created=1, root="file:///p", parent="demo")])
    assert msgspec.json.decode(msgspec.json.encode(listing)) == {
        "object": "list",
        "data": [{"id": "pirate", "object": "model", "created": 1, "owned_by": "lorafleet",
                  "root": "file:///p", "parent": "demo", "max_model_len": None, "loaded": True,
                  "status": None, "digest": None}],
    }  # fmt: skip


def test_error_body_has_openai_shape() -> None:
    body = OpenAIErrorResponse(error=OpenAIError(message="m", type="invalid_request_error"))
    assert msgspec.json.decode(msgspec.json.encode(body)) == {
        "error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}
    }
