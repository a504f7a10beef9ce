"""Talk to a worker's NATS subject the way a frontend does, for tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import nats

from lorafleet.proto.inference import (
    ErrorChunk,
    FinalChunk,
    GenerateRequest,
    StreamChunk,
    decode_chunk,
    encode_msg,
)


async def stream(
    nc: nats.aio.client.Client,
    subject: str,
    request: GenerateRequest,
    timeout_s: float = 10,
    on_chunk: Callable[[], None] = lambda: None,
) -> list[StreamChunk]:
    """Send ``request`` and collect chunks until the final or error chunk;
    ``on_chunk`` is called as each arrives."""
    inbox = nc.new_inbox()
    queue: asyncio.Queue[StreamChunk] = asyncio.Queue()

    async def on_msg(msg: nats.aio.msg.Msg) -> None:
        await queue.put(decode_chunk(msg.data))
        on_chunk()

    subscription = await nc.subscribe(inbox, cb=on_msg)
    await nc.publish(subject, encode_msg(request), reply=inbox)
    chunks: list[StreamChunk] = []
    async with asyncio.timeout(timeout_s):
        while not chunks or not isinstance(chunks[-1], FinalChunk | ErrorChunk):
            chunks.append(await queue.get())
    await subscription.unsubscribe()
    return chunks
