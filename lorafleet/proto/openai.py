"""HTTP bodies of the frontend's OpenAI-compatible API, requests and responses.

Request Structs carry ``Meta`` constraints so that Litestar validates them and
documents them in ``/openapi.json``: every field is bounded (``proto.limits``); text is
bounded as a whole by what NATS carries to a worker (413 beyond). Fields OpenAI
clients send that lorafleet does not know are skipped (msgspec skips unknown fields;
never set ``forbid_unknown_fields`` here); every field declared here is either served or
refused with a 400 that names it (``frontend.translate``, ``frontend.field_policy``), never
dropped, except OpenAI's labels (``user``, ...), which change no answer by definition.
Every field of the ``openai`` package's request types is declared (the field walk test
checks it). Pure data, no I/O.
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
LogitBias = Annotated[
    dict[int, Annotated[float, msgspec.Meta(ge=-100.0, le=100.0)]],
    msgspec.Meta(max_length=MAX_LIST_ITEMS, description="token id to a bias, -100 to 100"),
]
MinTokens = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS_LIMIT, description="0 to max_tokens")]
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
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    response_format: JsonObject | None = None
    """Refused with a 400 naming the engine unless ``{"type": "text"}`` (no engine here
    constrains output yet)."""
    logit_bias: LogitBias | None = None
    ignore_eos: bool = False
    """vLLM's: generate past end-of-sequence, up to ``max_tokens``."""
    min_tokens: MinTokens = 0
    """vLLM's: no end-of-sequence before this many tokens."""
    # Fields OpenAI or vLLM define that no engine here serves: declared so that a value
    # other than their neutral one is refused with a 400 naming them (``frontend.field_policy``)
    # rather than skipped as unknown.
    store: Any = None
    metadata: Any = None
    service_tier: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    top_k: Any = None
    min_p: Any = None
    stop_token_ids: Any = None
    include_stop_str_in_output: Any = None
    skip_special_tokens: Any = None
    spaces_between_special_tokens: Any = None
    truncate_prompt_tokens: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    prompt_logprobs: Any = None
    use_beam_search: Any = None
    length_penalty: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    priority: Any = None
    logits_processors: Any = None
    add_special_tokens: Any = None
    return_tokens_as_token_ids: Any = None
    # Labels OpenAI defines for its own accounting and caching: accepted, they never
    # change an answer (docs/frontend.md, field table).
    user: ShortText | None = None
    safety_identifier: ShortText | None = None
    prompt_cache_key: ShortText | None = None
    cache_salt: ShortText | None = None
    """vLLM's: prefix-cache blocks are shared only between requests with the same salt (and
    routed by it, ``docs/routing.md``); forwarded to the engine."""


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
    # Chat fields no engine here serves (refused unless neutral, ``frontend.field_policy``).
    audio: Any = None
    function_call: Any = None
    functions: Any = None
    modalities: Any = None
    moderation: Any = None
    parallel_tool_calls: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    add_generation_prompt: Any = None
    continue_final_message: Any = None
    chat_template: Any = None
    chat_template_kwargs: Any = None


class CompletionRequest(_Sampling, kw_only=True, frozen=True):
    """Body of ``POST /v1/completions``: one prompt (a string or a list of one string)."""

    prompt: str | Annotated[list[str], msgspec.Meta(min_length=1, max_length=MAX_LIST_ITEMS)]
    echo: bool = False
    logprobs: TopLogprobs | None = None
    best_of: Any = None
    """Refused unless 1: vLLM removed it (0.19), no engine here serves it."""
    suffix: Any = None
    """Refused unless empty: no engine here fills in the middle."""


class PromptTokensDetails(msgspec.Struct, kw_only=True, frozen=True):
    """OpenAI's breakdown of the prompt tokens: those served from the prefix cache."""

    cached_tokens: int = 0


class UsageInfo(msgspec.Struct, kw_only=True, frozen=True):
    """Token counts of a request, as OpenAI reports them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | msgspec.UnsetType = msgspec.UNSET
    """Only from engines that keep a prefix cache (the mocker, vLLM)."""


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
    digest: str | None = None
    """lorafleet's: an adapter's content digest (``sha256:<hex>``) as its card says; None for
    a base model, an adapter loaded nowhere, or a card from a worker without digests."""
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
    unreachable: dict[str, str] = msgspec.field(default_factory=dict)
    """Instances (hex id) this frontend lost over NATS and keeps out of routing until they
    answer a ping, and why: a cut or stalled NATS route shows here while etcd lists them."""
