"""Translate between OpenAI bodies and the request plane: pure functions, no I/O.

Checks here are the ones ``Meta`` constraints cannot express (``n``, content
parts, ``stream_options`` without ``stream``, a ``max_tokens`` above the
context, ``min_tokens`` above ``max_tokens``, fields no engine of the model serves:
``tools``, ``tool_choice``, ``response_format`` and those of ``frontend.field_policy``);
each raises ``BadFieldError`` naming the field (and the
engine, for what an engine cannot do). Nothing a client sets is silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import msgspec

from lorafleet.frontend.errors import BadFieldError
from lorafleet.frontend.field_policy import unserved_field
from lorafleet.frontend.registry import ServedModel
from lorafleet.proto.inference import (
    ChatMessage,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    Usage,
)
from lorafleet.proto.openai import (
    ChatCompletionRequest,
    ChatContentPart,
    ChatRequestMessage,
    CompletionRequest,
    PromptTokensDetails,
    UsageInfo,
)

__all__ = [
    "COMPLETIONS_DEFAULT_MAX_TOKENS",
    "FALLBACK_MAX_TOKENS",
    "chat_to_generate",
    "completion_to_generate",
    "openai_finish_reason",
    "usage_info",
]

SHOWN_VALUE_CHARS: Final = 60
"""How much of a refused field's value an error message repeats."""

COMPLETIONS_DEFAULT_MAX_TOKENS: Final = 16
"""OpenAI's documented default for ``/v1/completions``."""

FALLBACK_MAX_TOKENS: Final = 256
"""Chat default when the card gives no context length (otherwise: the context length)."""

_FINISH_REASONS: Final[Mapping[FinishReason, str]] = MappingProxyType(
    {"stop": "stop", "length": "length", "cancelled": "abort", "error": "error"}
)


def openai_finish_reason(reason: FinishReason) -> str:
    """OpenAI's (and vLLM's) name for why generation ended."""
    return _FINISH_REASONS.get(reason, reason)


def usage_info(usage: Usage) -> UsageInfo:
    """OpenAI's usage object from the worker's counts."""
    cached = usage.cached_tokens
    return UsageInfo(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=msgspec.UNSET
        if cached is None
        else PromptTokensDetails(cached_tokens=cached),
    )


def chat_to_generate(
    body: ChatCompletionRequest, served: ServedModel, request_id: str
) -> GenerateRequest:
    """The generate request for a chat body; raises ``BadFieldError``."""
    _check_serves(served, "chat", "chat completions")
    _check_common(body, served)
    _check_tools(body, served)
    if body.top_logprobs is not None and not body.logprobs:
        raise BadFieldError("top_logprobs", "needs logprobs set to true")
    messages = [_flatten(message, index) for index, message in enumerate(body.messages)]
    max_tokens = body.max_completion_tokens or body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    context = served.card.context_length
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    sampling = _sampling(body, max_tokens or context or FALLBACK_MAX_TOKENS, context, param)
    return GenerateRequest(
        request_id=request_id,
        model=body.model,
        messages=messages,
        sampling=msgspec.structs.replace(sampling, logprobs=logprobs),
        whole=not body.stream,
        cache_salt=body.cache_salt or "",
    )


def completion_to_generate(
    body: CompletionRequest, served: ServedModel, request_id: str
) -> GenerateRequest:
    """The generate request for a completions body; raises ``BadFieldError``."""
    _check_serves(served, "completions", "completions")
    _check_common(body, served)
    if body.echo:
        raise BadFieldError("echo", "echo=true is not supported")
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise BadFieldError(
                "prompt", f"batched prompts are not supported: got {len(prompt)}, send one"
            )
        prompt = prompt[0]
    max_tokens = body.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
    context = served.card.context_length
    sampling = _sampling(body, max_tokens, context, "max_tokens")
    return GenerateRequest(
        request_id=request_id,
        model=body.model,
        prompt=prompt,
        sampling=msgspec.structs.replace(sampling, logprobs=body.logprobs),
        whole=not body.stream,
        cache_salt=body.cache_salt or "",
    )


def _check_serves(served: ServedModel, kind: str, what: str) -> None:
    if kind not in served.card.model_type:
        raise BadFieldError("model", f"{served.name!r} does not serve {what}")


def _engines(served: ServedModel) -> str:
    """The engines of ``served``'s instances, for messages: ``'hf'``, ``'hf', 'vllm'``."""
    names = sorted({instance.engine or "unknown" for instance in served.instances})
    return ", ".join(map(repr, names)) or "'unknown'"


def _unsupported(param: str, what: str, served: ServedModel) -> BadFieldError:
    return BadFieldError(
        param, f"{what} is not supported by the engine of {served.name!r} ({_engines(served)})"
    )


def _check_tools(body: ChatCompletionRequest, served: ServedModel) -> None:
    """Refuse tool calling: no engine here parses tool calls out of the output yet."""
    if body.tools:
        raise _unsupported("tools", "tool calling", served)
    if body.tool_choice not in (None, "none", "auto"):
        raise _unsupported("tool_choice", f"tool_choice {body.tool_choice!r}", served)


def _check_common(body: ChatCompletionRequest | CompletionRequest, served: ServedModel) -> None:
    if body.n != 1:
        raise _unsupported("n", f"n={body.n} (more than one choice)", served)
    unserved = unserved_field(body)
    if unserved is not None:
        name, value = unserved
        raise _unsupported(name, f"{name}={repr(value)[:SHOWN_VALUE_CHARS]}", served)
    response_format = body.response_format
    if response_format is not None and response_format.get("type") != "text":
        kind = response_format.get("type")
        raise _unsupported("response_format", f"response_format of type {kind!r}", served)
    if body.stream_options is not None and not body.stream:
        raise BadFieldError("stream_options", "is allowed only when stream is true")
    stop = body.stop
    stops = [stop] if isinstance(stop, str) else stop or []
    if any(not text for text in stops):
        raise BadFieldError("stop", "stop sequences must not be empty strings")


def _sampling(
    body: ChatCompletionRequest | CompletionRequest, max_tokens: int, context: int, param: str
) -> SamplingParams:
    if context and max_tokens > context:
        raise BadFieldError(
            param, f"{max_tokens} is more than the model's context length of {context} tokens"
        )
    if body.min_tokens > max_tokens:
        raise BadFieldError("min_tokens", f"{body.min_tokens} is more than {param} of {max_tokens}")
    stop = body.stop
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        stop=[stop] if isinstance(stop, str) else list(stop or ()),
        seed=body.seed,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=body.repetition_penalty or 1.0,
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
        logit_bias=dict(body.logit_bias or {}),
    )


def _flatten(message: ChatRequestMessage, index: int) -> ChatMessage:
    content = message.content
    if content is None:
        return ChatMessage(role=message.role, content="")
    if isinstance(content, str):
        return ChatMessage(role=message.role, content=content)
    texts = [_part_text(part, index, position) for position, part in enumerate(content)]
    return ChatMessage(role=message.role, content="\n".join(texts))


def _part_text(part: ChatContentPart, index: int, position: int) -> str:
    where = f"messages[{index}].content[{position}]"
    if part.type != "text":
        raise BadFieldError(f"{where}.type", f"only 'text' parts are supported, got {part.type!r}")
    if part.text is None:
        raise BadFieldError(f"{where}.text", "a text part needs a 'text' string")
    return part.text
