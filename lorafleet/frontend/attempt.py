"""One try of a request on one instance, and what a stream needs of whoever makes tries.

``frontend.dispatcher`` makes attempts and implements ``Attempts``;
``frontend.token_stream`` owns one attempt at a time through that interface, so neither
module imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from lorafleet.frontend.errors import InstanceLostError, WorkerError
from lorafleet.frontend.metrics import FrontendMetrics
from lorafleet.frontend.registry import ServedModel
from lorafleet.frontend.request_plane import Reply
from lorafleet.proto.discovery import Instance
from lorafleet.proto.inference import GenerateRequest, StreamChunk

__all__ = ["Attempt", "Attempts"]


@dataclass(kw_only=True, slots=True)
class Attempt:
    """One try of a request on one instance."""

    instance: Instance
    reply: Reply
    request_id: str
    tokens: int = 0
    """The load it adds to its instance as the router counts it (``Router.load_of``)."""


class Attempts(Protocol):
    """Starts, reads and ends attempts: what a stream uses to read its answer and to
    continue it on another instance (``Dispatcher`` implements it)."""

    metrics: FrontendMetrics

    @property
    def migration_limit(self) -> int:
        """How often one stream may continue on another instance."""
        ...

    async def first_chunk(
        self, served: ServedModel, request: GenerateRequest
    ) -> tuple[Attempt, StreamChunk]:
        """Start ``request`` on an instance of ``served`` and wait for its first chunk."""
        ...

    async def next_chunk(self, attempt: Attempt) -> StreamChunk:
        """The next chunk of ``attempt``; raises ``InstanceLostError`` if its worker is gone."""
        ...

    def release(self, attempt: Attempt) -> None:
        """Stop listening to ``attempt`` (once)."""
        ...

    def cancel(self, attempt: Attempt) -> None:
        """Tell ``attempt``'s instance to stop its request."""
        ...

    def abandon(self, exc: InstanceLostError | WorkerError, attempt: Attempt) -> None:
        """Give ``attempt`` up after ``exc`` (quarantining its instance if it was lost)."""
        ...
