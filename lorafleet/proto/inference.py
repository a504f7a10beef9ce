"""The request plane: what a frontend sends to a worker's NATS subject and what streams back.

Everything on an instance subject is one tagged union (:data:`InstanceMessage`,
tag field ``kind``); everything on a reply inbox is another (:data:`StreamChunk`).
Both travel as msgpack. Do no I/O here.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from lorafleet.proto.adapters import LoraUpdate
from lorafleet.proto.errors import ErrorInfo

__all__ = [
    "CancelRequest",
    "ChatMessage",
    "ErrorChunk",
    "FinalChunk",
    "FinishReason",
    "GenerateRequest",
    "InstanceMessage",
    "KvSnapshotRequest",
    "PingRequest",
    "SamplingParams",
    "StreamChunk",
    "TokenChunk",
    "TokenLogprob",
    "TopLogprob",
    "UpdateReply",
    "UpdateRequest",
    "Usage",
    "decode_chunk",
    "decode_instance_message",
    "encode_msg",
    "join_tokens",
]

FinishReason = Literal["stop", "length", "cancelled", "error"]


class _Message(msgspec.Struct, kw_only=True, frozen=True, tag_field="kind"):
    """Base of tagged wire messages; the class's tag names its kind."""


class ChatMessage(msgspec.Struct, kw_only=True, frozen=True):
    """One chat turn, content already flattened to text by the frontend."""

    role: str
    content: str


class SamplingParams(msgspec.Struct, kw_only=True, frozen=True):
    """Sampling settings forwarded from the OpenAI request to the engine."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = msgspec.field(default_factory=list)
    seed: int | None = None
    logprobs: int | None = None
    """None: no log probabilities; ``k``: each token's log probability and its ``k`` most
    likely alternatives (0 gives the chosen token's alone)."""
    presence_penalty: float = 0.0
    """OpenAI's: subtracted once from the logit of every token already generated."""
    frequency_penalty: float = 0.0
    """OpenAI's: subtracted from a token's logit once per time it was generated."""
    repetition_penalty: float = 1.0
    """vLLM's (and transformers'): logits of prompt and generated tokens divided by it
    (multiplied when negative); 1 leaves them alone."""
    ignore_eos: bool = False
    """vLLM's: generate past end-of-sequence tokens, until ``max_tokens`` or a stop string
    (benchmarks ask for it to get exactly ``max_tokens`` tokens)."""
    min_tokens: int = 0
    """vLLM's: no end-of-sequence token before this many tokens were generated."""
    logit_bias: dict[int, float] = msgspec.field(default_factory=dict)
    """OpenAI's: token id to a value added to its logit before sampling (-100 bans it,
    100 all but forces it)."""


class GenerateRequest(_Message, frozen=True, tag="generate", omit_defaults=True):
    """Generate for ``model`` (base model or adapter name) from a prompt or chat messages.

    Fields at their defaults are left off the wire: a worker from before a field was
    added decodes the request as it always did.
    """

    request_id: str
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    generated_ids: list[int] = msgspec.field(default_factory=list)
    """Token ids another instance already generated (and the client received) for this
    request: the engine continues after them (stream migration). ``max_tokens`` then
    counts only the tokens still to come, and ``usage`` counts only those too."""
    cache_salt: str = ""
    """vLLM's ``cache_salt``: prefix-cache blocks are shared only between requests with the
    same salt (a tenant's name, when its tenant salts its requests; ``docs/routing.md``)."""
    whole: bool = False
    """The caller reads the answer only once it is complete (a non-streaming request): the
    worker may send every token in the final chunk's ``answer`` instead of one message per
    chunk, sparing both sides a message per token. Workers that predate it stream."""


class CancelRequest(_Message, frozen=True, tag="cancel"):
    """Stop generating for ``request_id``: its caller stopped listening."""

    request_id: str


class PingRequest(_Message, frozen=True, tag="ping"):
    """Liveness probe: a frontend asks whether the instance still answers.

    With ``request_id``, the instance answers 404 unless it is running that request:
    a request or its replies lost with a NATS server are then told from a slow engine.
    """

    request_id: str = ""


class KvSnapshotRequest(_Message, frozen=True, tag="kv_snapshot"):
    """Ask an instance for every KV block it holds (``proto.kv_events.KvSnapshot``): a
    frontend that started late or missed event batches rebuilds its view of it."""


class UpdateRequest(_Message, frozen=True, tag="update"):
    """Call an engine update (e.g. ``load_lora``) over NATS instead of HTTP.

    A LoRA update travels twice: typed in ``update`` (the tagged union that workers with
    the field decode) and as the JSON object ``body`` (what workers before it read, and the
    only form of an update outside ``LoraUpdate``). A worker uses ``update`` when it is set.
    """

    name: str
    body: dict[str, Any] = msgspec.field(default_factory=dict)
    update: LoraUpdate | None = None

    @classmethod
    def of(cls, name: str, request: msgspec.Struct) -> UpdateRequest:
        """The update ``name`` carrying ``request``, typed when it is a ``LoraUpdate``."""
        typed = request if isinstance(request, LoraUpdate) else None
        return cls(name=name, body=msgspec.to_builtins(request), update=typed)

    @property
    def payload(self) -> LoraUpdate | dict[str, Any]:
        """What the worker decodes: the typed update, else the JSON object."""
        return self.body if self.update is None else self.update


class UpdateReply(msgspec.Struct, kw_only=True, frozen=True):
    """Answer to a ping or an update: the HTTP status the status server would give and its body.

    ``error`` is set exactly when the update failed; ``body`` is then the error's
    documented JSON shape (``proto.errors.error_body``), for HTTP callers.
    """

    status_code: int = 200
    body: dict[str, Any] = msgspec.field(default_factory=dict)
    error: ErrorInfo | None = None


InstanceMessage = GenerateRequest | CancelRequest | PingRequest | KvSnapshotRequest | UpdateRequest


class Usage(msgspec.Struct, kw_only=True, frozen=True):
    """Token counts of one request, as OpenAI reports them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    """Prompt tokens the engine found in its prefix cache (vLLM's ``num_cached_tokens``);
    None from an engine that keeps no prefix cache."""

    @property
    def total_tokens(self) -> int:
        """Prompt and completion tokens together."""
        return self.prompt_tokens + self.completion_tokens


class TopLogprob(msgspec.Struct, kw_only=True, frozen=True, array_like=True):
    """One candidate token: its text and log probability (an array on the wire: compact)."""

    token: str
    logprob: float


class TokenLogprob(msgspec.Struct, kw_only=True, frozen=True, array_like=True):
    """The log probability of one generated token and of its most likely alternatives."""

    token: str
    logprob: float
    top: list[TopLogprob] = msgspec.field(default_factory=list)


class TokenChunk(_Message, frozen=True, tag="token"):
    """New text; ``tokens`` counts the tokens it holds, ``token_ids`` are their ids.

    The ids let a frontend continue the answer on another instance, token for token,
    should this one vanish (empty from engines that do not report them). ``logprobs``
    has one entry per token when the request asked for them (``SamplingParams.logprobs``).
    """

    text: str
    tokens: int = 1
    token_ids: list[int] = msgspec.field(default_factory=list)
    logprobs: list[TokenLogprob] = msgspec.field(default_factory=list)


class FinalChunk(_Message, frozen=True, tag="final", omit_defaults=True):
    """The last chunk of a successful stream."""

    finish_reason: FinishReason
    usage: Usage
    answer: TokenChunk | None = None
    """For a ``whole`` request: every token of the answer, sent here rather than in token
    chunks before (None when none were gathered: none generated, or a streaming request)."""
    since_first_token_s: float = 0.0
    """With ``answer``: seconds from its first token to this chunk leaving the worker, so
    the frontend can still time the first token."""


class ErrorChunk(_Message, frozen=True, tag="error"):
    """The last chunk of a failed stream: what went wrong, never silence."""

    error: ErrorInfo


StreamChunk = TokenChunk | FinalChunk | ErrorChunk

_encoder = msgspec.msgpack.Encoder()
_instance_decoder = msgspec.msgpack.Decoder(InstanceMessage)
_chunk_decoder = msgspec.msgpack.Decoder(StreamChunk)


def join_tokens(chunks: list[TokenChunk]) -> TokenChunk:
    """The token chunks of an answer, in order, as one chunk."""
    if len(chunks) == 1:
        return chunks[0]
    return TokenChunk(
        text="".join([chunk.text for chunk in chunks]),
        tokens=sum([chunk.tokens for chunk in chunks]),
        token_ids=[token_id for chunk in chunks for token_id in chunk.token_ids],
        logprobs=[logprob for chunk in chunks for logprob in chunk.logprobs],
    )


def encode_msg(message: msgspec.Struct) -> bytes:
    """Encode any request-plane message as msgpack."""
    return _encoder.encode(message)


def decode_instance_message(data: bytes) -> InstanceMessage:
    """Decode a message received on an instance subject."""
    return _instance_decoder.decode(data)


def decode_chunk(data: bytes) -> StreamChunk:
    """Decode a message received on a reply inbox."""
    return _chunk_decoder.decode(data)
