"""Streaming chat clients that hold every answer against the unmigrated one, and count migrations.

The reference is one whole answer to the same request, taken while a single
worker serves it, so nothing migrated. With deterministic answers (the
mocker's numbered tokens, greedy decoding on the demo model), a stream that
lost, repeated or restarted a token when its worker died and it migrated reads
differently; its ``usage`` must still count the whole answer.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from bench._http import HttpConnection, build_request, http_once
from bench._load import Call, Outcome, Session

__all__ = [
    "Answer",
    "StreamChecks",
    "checked_stream_session",
    "migrations",
    "stream_answer",
    "unmigrated_answer",
]

_DONE: Final = b"data: [DONE]"
_MIGRATIONS: Final = re.compile(
    rb"^lorafleet_frontend_stream_migrations_total\{[^}]*\} (\S+)$", re.M
)


@dataclass(frozen=True)
class Answer:
    """A chat answer's text and token counts."""

    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass
class StreamChecks:
    """Streams read, and how many were cut short, answered other text or other usage."""

    streams: int = 0
    failed: int = 0
    text_differs: int = 0
    usage_differs: int = 0

    def figures(self) -> dict[str, int]:
        """The counts, by name."""
        return dict(vars(self))


async def unmigrated_answer(port: int, body: dict[str, Any]) -> Answer:
    """The whole answer to ``body`` (a chat request) from the frontend on ``port``."""
    response = await http_once(port, "POST", "/v1/chat/completions", body)
    if response.status != 200:
        raise RuntimeError(f"the reference request answered HTTP {response.status}")
    answer = msgspec.json.decode(response.body)
    usage = answer["usage"]
    text = answer["choices"][0]["message"]["content"]
    return Answer(text, usage["prompt_tokens"], usage["completion_tokens"])


def checked_stream_session(
    port: int, body: dict[str, Any], expected: Answer, checks: StreamChecks
) -> Session:
    """Each task: a keep-alive connection streaming ``body`` again and again, each checked."""
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    raw = build_request("POST", "127.0.0.1", port, "/v1/chat/completions", streamed)

    async def open_session() -> tuple[Call, Callable[[], Awaitable[None]]]:
        connection = await HttpConnection.open("127.0.0.1", port)

        async def call() -> Outcome:
            response = await connection.request(raw, watch_tokens=True)
            checks.streams += 1
            answer = stream_answer(response.body) if response.status == 200 else None
            if answer is None:
                checks.failed += 1
                return Outcome(False)
            text_ok = answer.text == expected.text
            usage_ok = answer == Answer(answer.text, expected.prompt_tokens,
                                       expected.completion_tokens)  # fmt: skip
            checks.text_differs += not text_ok
            checks.usage_differs += not usage_ok
            return Outcome(text_ok and usage_ok, response.first_token_at)

        return call, connection.close

    return open_session


def stream_answer(body: bytes) -> Answer | None:
    """The text and usage of a complete stream; None when it ended early or with an error."""
    lines = [line for line in body.split(b"\n") if line.startswith(b"data: ")]
    if not lines or lines[-1] != _DONE:
        return None
    events = [msgspec.json.decode(line[6:]) for line in lines[:-1]]
    if any("error" in event for event in events):
        return None
    text = "".join(_content(event) for event in events)
    usage: dict[str, Any] = next((e["usage"] for e in events if e.get("usage")), {})
    return Answer(text, usage.get("prompt_tokens", -1), usage.get("completion_tokens", -1))


def _content(event: dict[str, Any]) -> str:
    choices = event.get("choices") or [{}]
    return str(choices[0].get("delta", {}).get("content") or "")


async def migrations(port: int) -> float:
    """Streams the frontend on ``port`` migrated so far, over every model."""
    response = await http_once(port, "GET", "/metrics")
    return sum(float(value) for value in _MIGRATIONS.findall(response.body))
