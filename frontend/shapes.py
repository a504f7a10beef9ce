"""Build OpenAI response bodies and SSE frames for chat and completions; pure, no I/O.

A :class:`Shape` knows how one endpoint's answers look: the whole response,
and for streams the opening frame, token frames, the finishing frame and the
usage frame. ``sse`` turns any body into one ``data:`` event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from frontend.translate import openai_finish_reason, usage_info
from proto.inference import FinalChunk
from proto.openai import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatResponseMessage,
    CompletionChoice,
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
    """What every frame of one answer shares: its id, creation time and model name."""

    id: str
    created: int
    model: str


class Shape:
    """How one endpoint's answers look; the base has the completions layout."""

    endpoint: str = "completions"
    id_prefix: str = "cmpl-"

    def whole(self, answer: Answer, text: str, final: FinalChunk) -> msgspec.Struct:
        """The non-streaming response."""
        choice = CompletionChoice(
            text=text, finish_reason=openai_finish_reason(final.finish_reason)
        )
        return CompletionResponse(
            id=answer.id, created=answer.created, model=answer.model, choices=[choice],
            usage=usage_info(final.usage),
        )  # fmt: skip

    def opening(self, answer: Answer) -> bytes:
        """Frames sent before the first token (none for completions)."""
        return b""

    def token(self, answer: Answer, text: str) -> bytes:
        """The frame carrying new text."""
        return sse(self._chunk(answer, text, None))

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

    def _chunk(self, answer: Answer, text: str, finish: str | None) -> msgspec.Struct:
        return CompletionResponse(
            id=answer.id, created=answer.created, model=answer.model,
            choices=[CompletionChoice(text=text, finish_reason=finish)],
        )  # fmt: skip


class CompletionsShape(Shape):
    """``/v1/completions``: ``text_completion`` objects, whole and streamed."""


class ChatShape(Shape):
    """``/v1/chat/completions``: a message when whole, deltas when streamed."""

    endpoint = "chat"
    id_prefix = "chatcmpl-"

    def whole(self, answer: Answer, text: str, final: FinalChunk) -> msgspec.Struct:
        message = ChatResponseMessage(content=text)
        reason = openai_finish_reason(final.finish_reason)
        return ChatCompletionResponse(
            id=answer.id, created=answer.created, model=answer.model,
            choices=[ChatChoice(message=message, finish_reason=reason)],
            usage=usage_info(final.usage),
        )  # fmt: skip

    def opening(self, answer: Answer) -> bytes:
        return sse(self._delta(answer, _ROLE_DELTA, None))

    def token(self, answer: Answer, text: str) -> bytes:
        return sse(self._delta(answer, ChatDelta(content=text), None))

    def finishing(self, answer: Answer, final: FinalChunk) -> bytes:
        return sse(self._delta(answer, _EMPTY_DELTA, openai_finish_reason(final.finish_reason)))

    def usage(self, answer: Answer, final: FinalChunk) -> bytes:
        return sse(
            ChatCompletionChunk(
                id=answer.id, created=answer.created, model=answer.model, choices=[],
                usage=usage_info(final.usage),
            )
        )  # fmt: skip

    def _delta(self, answer: Answer, delta: ChatDelta, finish: str | None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=answer.id, created=answer.created, model=answer.model,
            choices=[ChatChunkChoice(delta=delta, finish_reason=finish)],
        )  # fmt: skip


CHAT: Final = ChatShape()
COMPLETIONS: Final = CompletionsShape()
