"""Streaming chat clients that check every answer, token for token, and the frontend's migrations.

The mocker's answer to ``max_tokens=n`` is always ``{model}:0 ... {model}:n-1``,
as greedy as decoding gets: a stream that lost, repeated or restarted a token
when its worker died (and it migrated) reads differently, and its ``usage``
must still count the whole answer.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from bench._http import HttpConnection, build_request, http_once
from bench._load import Call, Outcome, Session

__all__ = ["StreamChecks", "checked_stream_session", "migrations"]

_DONE: Final = b"data: [DONE]"
_MIGRATIONS: Final = re.compile(
    rb"^lorafleet_frontend_stream_migrations_total\{[^}]*\} (\S+)$", re.M
)


@dataclass
class StreamChecks:
    """Streams read, and how many were cut short, answered wrong text or wrong usage."""

    streams: int = 0
    failed: int = 0
    text_differs: int = 0
    usage_differs: int = 0

    def figures(self) -> dict[str, int]:
        """The counts, by name."""
        return dict(vars(self))


def checked_stream_session(
    port: int, model: str, prompt: str, max_tokens: int, checks: StreamChecks
) -> Session:
    """Each task: a keep-alive connection streaming one chat request again and again, checked."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    raw = build_request("POST", "127.0.0.1", port, "/v1/chat/completions", body)
    expected = "".join(f"{model}:{index} " for index in range(max_tokens))
    prompt_words = len(prompt.split())

    async def open_session() -> tuple[Call, Callable[[], Awaitable[None]]]:
        connection = await HttpConnection.open("127.0.0.1", port)

        async def call() -> Outcome:
            response = await connection.request(raw, watch_tokens=True)
            checks.streams += 1
            events = _events(response.body) if response.status == 200 else None
            if events is None:
                checks.failed += 1
                return Outcome(False)
            text = "".join(_content(event) for event in events)
            usage = next((e["usage"] for e in events if e.get("usage")), None)
            text_ok = text == expected
            usage_ok = usage is not None and (
                usage["prompt_tokens"],
                usage["completion_tokens"],
            ) == (prompt_words, max_tokens)
            checks.text_differs += not text_ok
            checks.usage_differs += not usage_ok
            return Outcome(text_ok and usage_ok, response.first_token_at)

        return call, connection.close

    return open_session


def _events(body: bytes) -> list[dict[str, Any]] | None:
    """The JSON events of a complete stream, or None when it ended with an error or early."""
    lines = [line for line in body.split(b"\n") if line.startswith(b"data: ")]
    if not lines or lines[-1] != _DONE:
        return None
    events = [msgspec.json.decode(line[6:]) for line in lines[:-1]]
    return None if any("error" in event for event in events) else events


def _content(event: dict[str, Any]) -> str:
    choices = event.get("choices") or [{}]
    return str(choices[0].get("delta", {}).get("content") or "")


async def migrations(port: int) -> float:
    """Streams the frontend on ``port`` migrated so far, over every model."""
    response = await http_once(port, "GET", "/metrics")
    return sum(float(value) for value in _MIGRATIONS.findall(response.body))
