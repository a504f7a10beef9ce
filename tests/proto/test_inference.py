"""Request-plane codecs: update replies stay readable across versions, errors stay typed."""

from __future__ import annotations

from typing import Any

import msgspec

from lorafleet.proto.adapters import LoadLoraRequest, LoraSource
from lorafleet.proto.errors import ErrorInfo, NotFoundError
from lorafleet.proto.inference import (
    FinalChunk,
    GenerateRequest,
    TokenChunk,
    UpdateReply,
    UpdateRequest,
    Usage,
    decode_chunk,
    decode_instance_message,
    encode_msg,
    join_tokens,
)


class _OlderUpdateReply(msgspec.Struct, kw_only=True, frozen=True):
    """``UpdateReply`` as workers sent it before it carried a typed error."""

    status_code: int = 200
    body: dict[str, Any] = msgspec.field(default_factory=dict)


def test_a_reply_from_an_older_worker_decodes_without_an_error() -> None:
    older = _OlderUpdateReply(status_code=404, body={"status": "error", "code": "not_found"})
    reply = msgspec.msgpack.decode(encode_msg(older), type=UpdateReply)
    assert (reply.status_code, reply.error) == (404, None)


def test_an_error_reply_round_trips_with_its_reason() -> None:
    info = NotFoundError("LoRA source file:///a: missing; check the roots", reason="missing")
    sent = UpdateReply(status_code=404, error=info.to_info())
    reply = msgspec.msgpack.decode(encode_msg(sent), type=UpdateReply)
    assert reply.error == ErrorInfo(
        code="not_found",
        message="LoRA source file:///a: missing; check the roots",
        reason="missing",
    )


class _OlderUpdateRequest(msgspec.Struct, kw_only=True, frozen=True, tag_field="kind",
                          tag="update"):  # fmt: skip
    """``UpdateRequest`` as workers decoded it before the typed ``update``."""

    name: str
    body: dict[str, Any]


class _OlderLoadLoraRequest(msgspec.Struct, kw_only=True, frozen=True):
    """``LoadLoraRequest`` before it was tagged."""

    lora_name: str
    source: LoraSource


def test_an_update_request_carries_its_struct_typed_and_as_the_older_wire_object() -> None:
    load = LoadLoraRequest(lora_name="pirate", source=LoraSource(uri="file:///a/pirate"))
    wire = encode_msg(UpdateRequest.of("update/load_lora", load))

    message = decode_instance_message(wire)
    assert isinstance(message, UpdateRequest)
    assert message.update == load and message.payload == load
    older = msgspec.msgpack.decode(wire, type=_OlderUpdateRequest)  # a worker before the field
    assert msgspec.convert(older.body, _OlderLoadLoraRequest) == _OlderLoadLoraRequest(
        lora_name="pirate", source=load.source
    )


def test_an_update_request_from_an_older_frontend_is_read_from_its_object() -> None:
    body = {"lora_name": "pirate", "source": {"uri": "file:///a/pirate"}}
    wire = msgspec.msgpack.encode({"kind": "update", "name": "update/load_lora", "body": body})
    message = decode_instance_message(wire)
    assert isinstance(message, UpdateRequest)
    assert message.update is None and message.payload == body
    assert msgspec.convert(message.payload, LoadLoraRequest).lora_name == "pirate"


class _OlderFinalChunk(msgspec.Struct, kw_only=True, frozen=True, tag_field="kind", tag="final"):
    """``FinalChunk`` as frontends decoded it before it could carry the answer."""

    finish_reason: str
    usage: Usage


def test_a_streaming_request_and_its_final_chunk_keep_their_older_wire_form() -> None:
    request = GenerateRequest(request_id="r", model="m")
    assert b"whole" not in encode_msg(request)  # an older worker reads what it always read
    final = FinalChunk(finish_reason="stop", usage=Usage(completion_tokens=2))
    older = msgspec.msgpack.decode(encode_msg(final), type=_OlderFinalChunk)
    assert (older.finish_reason, older.usage) == ("stop", final.usage)


def test_a_whole_request_and_its_gathered_answer_round_trip() -> None:
    request = decode_instance_message(
        encode_msg(GenerateRequest(request_id="r", model="m", whole=True))
    )
    assert isinstance(request, GenerateRequest) and request.whole
    chunks = [
        TokenChunk(text="a ", token_ids=[1]),
        TokenChunk(text="b", tokens=2, token_ids=[2, 3]),
    ]
    answer = join_tokens(chunks)
    assert answer == TokenChunk(text="a b", tokens=3, token_ids=[1, 2, 3])
    final = FinalChunk(
        finish_reason="length", usage=Usage(), answer=answer, since_first_token_s=0.5
    )
    assert decode_chunk(encode_msg(final)) == final
