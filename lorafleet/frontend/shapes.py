"""Build OpenAI response bodies and SSE frames for chat and completions; pure, no I/O.

A :class:`Shape` knows how one endpoint's answers look: the whole response,
and for streams the opening frame, token frames, the finishing frame and the
usage frame. ``sse`` turns any body into one ``data:`` event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from lorafleet.frontend.translate import openai_finish_reason, usage_info
from lorafleet.proto.inference import FinalChunk, TokenChunk, TokenLogprob
from lorafleet.proto.openai import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatResponseMessage,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
)

__all__ = [
    "Answer",
    "CHAT",
    "COMPLETIONS",
    "ChatShape",
    "CompletionsShape",
    "SSE_DONE",
    "Shape",
    "chat_logprobs",
    "completion_logprobs",
    "sse",
]

SSE_DONE: Final = b"data: [DONE]\n\n"
_encoder: Final = msgspec.json.Encoder()
_ROLE_DELTA: Final = ChatDelta(role="assistant", content="")
_EMPTY_DELTA: Final = ChatDelta()


def sse(body: msgspec.Struct) -> bytes:
    """One server-sent event carrying ``body`` as JSON."""
    return b"data: " + _encoder.encode(body) + b"\n\n"


@dataclass(frozen=True, slots=True)
class Answer:
    """What every frame of one answer shares: its id, creation time and model name.

    ``logprobs``: whether the request asked for log probabilities (then every choice
    carries them, possibly empty).
    """

    id: str
    created: int
    model: str
    logprobs: bool = False


def chat_logprobs(logprobs: list[TokenLogprob]) -> ChatLogprobs:
    """OpenAI's chat ``logprobs``: per token its text, log probability, UTF-8 bytes, top."""
    return ChatLogprobs(
        content=[
            ChatTokenLogprob(
                token=item.token, logprob=item.logprob, bytes=list(item.token.encode()),
                top_logprobs=[
                    ChatTopLogprob(token=t.token, logprob=t.logprob, bytes=list(t.token.encode()))
                    for t in item.top
                ],
            )
            for item in logprobs
        ]
    )  # fmt: skip


def completion_logprobs(logprobs: list[TokenLogprob], text_start: int = 0) -> CompletionLogprobs:
    """OpenAI's legacy completions ``logprobs``; offsets count from ``text_start``."""
    offsets, offset = [], text_start
    for item in logprobs:
        offsets.append(offset)
        offset += len(item.token)
    return CompletionLogprobs(
        tokens=[item.token for item in logprobs],
        token_logprobs=[item.logprob for item in logprobs],
        top_logprobs=[{t.token: t.logprob for t in item.top} for item in logprobs],
        text_offset=offsets,
    )


class Shape:
    """How one endpoint's answers look; the base has the completions layout."""

    endpoint: str = "completions"
    id_prefix: str = "cmpl-"

    def whole(
        self, answer: Answer, text: str, final: FinalChunk, logprobs: list[TokenLogprob]
    ) -> msgspec.Struct:
        """The non-streaming response."""
        choice = CompletionChoice(
            text=text, finish_reason=openai_finish_reason(final.finish_reason),
            logprobs=completion_logprobs(logprobs) if answer.logprobs else None,
        )  # fmt: skip
        return CompletionResponse(
            id=answer.id, created=answer.created, model=answer.model, choices=[choice],
            usage=usage_info(final.usage),
        )  # fmt: skip

    def opening(self, answer: Answer) -> bytes:
        """Frames sent before the first token (none for completions)."""
        return b""

    def token(self, answer: Answer, chunk: TokenChunk) -> bytes:
        """The frame carrying new text (and its log probabilities, if asked for)."""
        logprobs = completion_logprobs(chunk.logprobs) if answer.logprobs else None
        return sse(self._chunk(answer, chunk.text, None, logprobs))

    def finishing(self, answer: Answer, final: FinalChunk) -> bytes:
        """The frame that says why generation ended."""
        return sse(self._chunk(answer, "", openai_finish_reason(final.finish_reason)))

    def usage(self, answer: Answer, final: FinalChunk) -> bytes:
        """The ``include_usage`` frame: no choices, only ``usage``."""
        return sse(
            CompletionResponse(
                id=answer.id, created=answer.created, model=answer.model, choices=[],
                usage=usage_info(final.usage),
            )
        )  # fmt: skip

    def _chunk(
        self,
        answer: Answer,
        text: str,
        finish: str | None,
        logprobs: CompletionLogprobs | None = None,
    ) -> msgspec.Struct:
        choice = CompletionChoice(text=text, finish_reason=finish, logprobs=logprobs)
        return CompletionResponse(
            id=answer.id, created=answer.created, model=answer.model, choices=[choice]
        )


class CompletionsShape(Shape):
    """``/v1/completions``: ``text_completion`` objects, whole and streamed."""


class ChatShape(Shape):
    """``/v1/chat/completions``: a message when whole, deltas when streamed."""

    endpoint = "chat"
    id_prefix = "chatcmpl-"

    def whole(
        self, answer: Answer, text: str, final: FinalChunk, logprobs: list[TokenLogprob]
    ) -> msgspec.Struct:
        message = ChatResponseMessage(content=text)
        reason = openai_finish_reason(final.finish_reason)
        scores = chat_logprobs(logprobs) if answer.logprobs else None
        return ChatCompletionResponse(
            id=answer.id, created=answer.created, model=answer.model,
            choices=[ChatChoice(message=message, finish_reason=reason, logprobs=scores)],
            usage=usage_info(final.usage),
        )  # fmt: skip

    def opening(self, answer: Answer) -> bytes:
        return sse(self._delta(answer, _ROLE_DELTA, None))

    def token(self, answer: Answer, chunk: TokenChunk) -> bytes:
        logprobs = chat_logprobs(chunk.logprobs) if answer.logprobs else None
        return sse(self._delta(answer, ChatDelta(content=chunk.text), None, logprobs))

    def finishing(self, answer: Answer, final: FinalChunk) -> bytes:
        return sse(self._delta(answer, _EMPTY_DELTA, openai_finish_reason(final.finish_reason)))

    def usage(self, answer: Answer, final: FinalChunk) -> bytes:
        return sse(
            ChatCompletionChunk(
                id=answer.id, created=answer.created, model=answer.model, choices=[],
                usage=usage_info(final.usage),
            )
        )  # fmt: skip

    def _delta(
        self,
        answer: Answer,
        delta: ChatDelta,
        finish: str | None,
        logprobs: ChatLogprobs | None = None,
    ) -> ChatCompletionChunk:
        choice = ChatChunkChoice(delta=delta, finish_reason=finish, logprobs=logprobs)
        return ChatCompletionChunk(
            id=answer.id, created=answer.created, model=answer.model, choices=[choice]
        )


CHAT: Final = ChatShape()
COMPLETIONS: Final = CompletionsShape()
