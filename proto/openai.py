"""HTTP bodies of the frontend's OpenAI-compatible API, requests and responses.

Request Structs carry ``Meta`` constraints so that Litestar validates them and
documents them in ``/openapi.json``: every field is bounded (``proto.limits``); text is
bounded as a whole by what NATS carries to a worker (413 beyond). Fields OpenAI
clients send that lorafleet does not know are skipped (msgspec skips unknown fields;
never set ``forbid_unknown_fields`` here); every field declared here is either served or
refused with a 400 that names it (``frontend.translate``), never dropped. Pure data, no I/O.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from lorafleet.proto.adapters import AdapterLoadError, AdapterState
from lorafleet.proto.limits import (
    INT64_MAX,
    INT64_MIN,
    MAX_LIST_ITEMS,
    MAX_MODEL_NAME_CHARS,
    MAX_SHORT_TEXT_CHARS,
    MAX_TOKENS_LIMIT,
)

__all__ = [
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatContentPart",
    "ChatDelta",
    "ChatLogprobs",
    "ChatRequestMessage",
    "ChatResponseMessage",
    "ChatTokenLogprob",
    "ChatTopLogprob",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "CompletionResponse",
    "FrontendHealth",
    "ModelList",
    "ModelObject",
    "ModelStatus",
    "OpenAIError",
    "OpenAIErrorResponse",
    "StreamOptions",
    "UsageInfo",
]

MAX_STOP_SEQUENCES: Final = 16
MAX_STOP_CHARS: Final = 1024
MAX_N: Final = 128
MAX_TOP_LOGPROBS: Final = 20
"""vLLM's default ``max_logprobs``; OpenAI allows 20 for chat, 5 for completions."""
MAX_TOOLS: Final = 128

MaxTokens = Annotated[
    int, msgspec.Meta(ge=1, le=MAX_TOKENS_LIMIT, description="1 to 2**31 - 1 tokens")
]
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0, description="0 to 2")]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0, description="above 0, at most 1")]
Seed = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX, description="a 64-bit integer")]
ModelName = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=MAX_MODEL_NAME_CHARS, description="a name from /v1/models"
    ),
]
ShortText = Annotated[str, msgspec.Meta(max_length=MAX_SHORT_TEXT_CHARS)]
StopText = Annotated[str, msgspec.Meta(max_length=MAX_STOP_CHARS)]
Stop = Annotated[
    StopText | Annotated[list[StopText], msgspec.Meta(max_length=MAX_STOP_SEQUENCES)] | None,
    msgspec.Meta(
        description=f"a string or up to {MAX_STOP_SEQUENCES}, each at most {MAX_STOP_CHARS} "
        "characters"
    ),
]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0, description="-2 to 2")]
RepetitionPenalty = Annotated[
    float, msgspec.Meta(gt=0.0, le=10.0, description="above 0, at most 10; 1 is none")
]
TopLogprobs = Annotated[
    int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS, description=f"0 to {MAX_TOP_LOGPROBS}")
]
JsonObject = dict[str, Any]
ChatRole = Literal["system", "developer", "user", "assistant", "tool", "function"]


class StreamOptions(msgspec.Struct, kw_only=True, frozen=True):
    """``stream_options``: ``include_usage`` adds a last chunk that carries ``usage``."""

    include_usage: bool = False


class _Sampling(msgspec.Struct, kw_only=True, frozen=True):
    """Sampling fields both request kinds share; forwarded to the worker."""

    model: ModelName
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_N, description="only 1 is served")] = 1
    stop: Stop = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: ShortText | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    response_format: JsonObject | None = None
    """Refused with a 400 naming the engine unless ``{"type": "text"}`` (no engine here
    constrains output yet)."""


class ChatContentPart(msgspec.Struct, kw_only=True, frozen=True):
    """One part of a message's content; only ``type: "text"`` parts are served."""

    type: ShortText
    text: str | None = None


ContentParts = Annotated[list[ChatContentPart], msgspec.Meta(max_length=MAX_LIST_ITEMS)]


class ChatRequestMessage(msgspec.Struct, kw_only=True, frozen=True):
    """One turn of ``messages``: content is text or a list of text parts."""

    role: ChatRole
    content: str | ContentParts | None = None
    name: ShortText | None = None


class ChatCompletionRequest(_Sampling, kw_only=True, frozen=True):
    """Body of ``POST /v1/chat/completions``."""

    messages: Annotated[
        list[ChatRequestMessage], msgspec.Meta(min_length=1, max_length=MAX_LIST_ITEMS)
    ]
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    tools: Annotated[list[JsonObject], msgspec.Meta(max_length=MAX_TOOLS)] | None = None
    """Refused with a 400 naming the engine: no engine here parses tool calls yet."""
    tool_choice: ShortText | JsonObject | None = None
    """Accepted only as ``"none"`` (or with no ``tools``); otherwise refused like ``tools``."""


class CompletionRequest(_Sampling, kw_only=True, frozen=True):
    """Body of ``POST /v1/completions``: one prompt (a string or a list of one string)."""

    prompt: str | Annotated[list[str], msgspec.Meta(min_length=1, max_length=MAX_LIST_ITEMS)]
    echo: bool = False
    logprobs: TopLogprobs | None = None


class UsageInfo(msgspec.Struct, kw_only=True, frozen=True):
    """Token counts of a request, as OpenAI reports them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ChatTopLogprob(msgspec.Struct, kw_only=True, frozen=True):
    """One likely token at a position of a chat answer, as OpenAI reports it."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(msgspec.Struct, kw_only=True, frozen=True):
    """One token of a chat answer with its log probability and the likeliest alternatives."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[ChatTopLogprob] = msgspec.field(default_factory=list)


class ChatLogprobs(msgspec.Struct, kw_only=True, frozen=True):
    """``choices[].logprobs`` of a chat answer: one entry per generated token."""

    content: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(msgspec.Struct, kw_only=True, frozen=True):
    """``choices[].logprobs`` of a completions answer, in the legacy OpenAI layout."""

    tokens: list[str] = msgspec.field(default_factory=list)
    token_logprobs: list[float | None] = msgspec.field(default_factory=list)
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int] = msgspec.field(default_factory=list)


class ChatResponseMessage(msgspec.Struct, kw_only=True, frozen=True):
    """The assistant's answer in a non-streaming chat response."""

    content: str
    role: str = "assistant"


class ChatChoice(msgspec.Struct, kw_only=True, frozen=True):
    """One choice of a non-streaming chat response."""

    message: ChatResponseMessage
    finish_reason: str | None
    index: int = 0
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(msgspec.Struct, kw_only=True, frozen=True):
    """Answer of ``POST /v1/chat/completions`` without streaming."""

    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    object: Literal["chat.completion"] = "chat.completion"


class ChatDelta(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What a streamed chat chunk adds: the role once, then content."""

    role: str | None = None
    content: str | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True, frozen=True):
    """One choice of a streamed chat chunk."""

    delta: ChatDelta
    finish_reason: str | None = None
    index: int = 0
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True, frozen=True):
    """One SSE event of a streamed chat response; the usage chunk has no choices."""

    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


class CompletionChoice(msgspec.Struct, kw_only=True, frozen=True):
    """One choice of a completions response or chunk."""

    text: str
    finish_reason: str | None = None
    index: int = 0
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(msgspec.Struct, kw_only=True, frozen=True):
    """Answer of ``POST /v1/completions``, whole or one streamed chunk of it."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    object: Literal["text_completion"] = "text_completion"


class ModelStatus(msgspec.Struct, kw_only=True, frozen=True):
    """Where a desired adapter that no instance has loaded stands (``AdapterStatus.state``)."""

    state: AdapterState
    error: AdapterLoadError | None = None
    """Its last failed load while ``state`` is ``failed``."""


class ModelObject(msgspec.Struct, kw_only=True, frozen=True):
    """One entry of ``/v1/models``; vLLM's ``root`` and ``parent`` (an adapter's base).

    ``loaded`` is lorafleet's: false for an adapter of the desired state that no
    live instance has loaded yet (the first request loads it on demand).
    """

    id: str
    created: int
    owned_by: str = "lorafleet"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    loaded: bool = True
    status: ModelStatus | None = None
    """lorafleet's: a desired adapter that no live instance has loaded says why (None otherwise)."""
    object: Literal["model"] = "model"


class ModelList(msgspec.Struct, kw_only=True, frozen=True):
    """Answer of ``GET /v1/models``."""

    data: list[ModelObject]
    object: Literal["list"] = "list"


class OpenAIError(msgspec.Struct, kw_only=True, frozen=True):
    """What went wrong: a message that names the problem, OpenAI's type, the field, a code."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(msgspec.Struct, kw_only=True, frozen=True):
    """Every error the frontend answers: ``{"error": {...}}``."""

    error: OpenAIError


class FrontendHealth(msgspec.Struct, kw_only=True, frozen=True):
    """Answer of ``GET /health``: ``healthy`` while NATS is connected and the view of
    etcd is current, ``degraded`` while etcd is cut off."""

    status: Literal["healthy", "degraded", "unhealthy"]
    nats: str
    etcd: str = "in sync"
    models: int = 0
    instances: int = 0
