"""The request plane on a real NATS server: reply routing, no-responder status, ping, cancel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest

from lorafleet.discovery.nats_connection import NatsConnection, flush_subscriptions
from lorafleet.discovery.nats_settings import NatsSettings
from lorafleet.frontend.dispatcher import DispatchSettings
from lorafleet.frontend.errors import InstanceLostError
from lorafleet.frontend.request_plane import RequestPlane, is_no_responders
from lorafleet.proto.inference import (
    CancelRequest,
    GenerateRequest,
    PingRequest,
    TokenChunk,
    UpdateReply,
    decode_chunk,
    decode_instance_message,
    encode_msg,
)


@pytest.fixture
async def plane(nats_url: str) -> AsyncIterator[RequestPlane]:
    async with await NatsConnection.connect(
        NatsSettings(servers=(nats_url,)), name="test-frontend"
    ) as conn:
        plane = await RequestPlane.start(conn)
        yield plane
        await plane.aclose()


@pytest.fixture
async def echo(nats_url: str, namespace: str) -> AsyncIterator[tuple[str, list]]:
    """A subject that answers each generate request with three chunks naming its request."""
    subject, seen = f"{namespace}.echo", []
    nc = await nats.connect(nats_url)

    async def answer(msg) -> None:
        message = decode_instance_message(msg.data)
        seen.append(message)
        if isinstance(message, GenerateRequest):
            for index in range(3):
                chunk = TokenChunk(text=f"{message.request_id}:{index}")
                await nc.publish(msg.reply, encode_msg(chunk))
        elif isinstance(message, PingRequest):
            await nc.publish(msg.reply, encode_msg(UpdateReply()))

    await nc.subscribe(subject, cb=answer)
    await flush_subscriptions(nc)
    yield subject, seen
    await nc.close()


async def _texts(reply, count: int) -> list[str]:
    return [decode_chunk((await reply.next(5)).data).text for _ in range(count)]


async def test_concurrent_requests_each_get_their_own_replies(plane, echo) -> None:
    subject, _seen = echo
    replies = [
        await plane.open(subject, GenerateRequest(request_id=f"r{i}", model="m")) for i in range(20)
    ]
    texts = await asyncio.gather(*(_texts(reply, 3) for reply in replies))
    assert texts == [[f"r{i}:{k}" for k in range(3)] for i in range(20)]
    for reply in replies:
        reply.close()
    assert plane.open_replies == 0


async def test_a_subject_nobody_serves_answers_no_responders(plane, namespace) -> None:
    reply = await plane.open(f"{namespace}.nobody", GenerateRequest(request_id="r", model="m"))
    msg = await reply.next(5)
    reply.close()
    assert msg is not None and is_no_responders(msg)


@pytest.fixture
async def silent(nats_url: str, namespace: str) -> AsyncIterator[str]:
    """A subject with a subscriber that never answers, not even pings."""
    nc = await nats.connect(nats_url)
    await nc.subscribe(f"{namespace}.silent")
    await flush_subscriptions(nc)
    yield f"{namespace}.silent"
    await nc.close()


async def test_receive_decodes_the_replies_in_order(plane, echo) -> None:
    subject, _seen = echo
    reply = await plane.open(subject, GenerateRequest(request_id="r", model="m"))
    patience = DispatchSettings(stall_s=5)
    chunks = [await reply.receive(decode_chunk, 1, patience) for _ in range(3)]
    reply.close()
    assert [chunk.text for chunk in chunks] == ["r:0", "r:1", "r:2"]


async def test_receive_gives_up_on_an_instance_that_is_silent_and_misses_its_ping(
    plane, silent
) -> None:
    reply = await plane.open(silent, GenerateRequest(request_id="r", model="m"))
    patience = DispatchSettings(stall_s=0.1, ping_timeout_s=0.2)
    with pytest.raises(InstanceLostError) as lost:
        await reply.receive(decode_chunk, 0xA, patience, request_id="r")
    reply.close()
    assert lost.value.stalled and not lost.value.link_dropped
    assert "stopped answering or lost the request" in lost.value.message


async def test_receive_after_the_link_dropped_between_reads_blames_the_link(plane, silent) -> None:
    reply = await plane.open(silent, GenerateRequest(request_id="r", model="m"))
    reply.drop()  # what the plane does to every open reply when its NATS link drops
    with pytest.raises(InstanceLostError) as lost:
        await reply.receive(decode_chunk, 0xA, DispatchSettings(stall_s=5))
    reply.close()
    assert lost.value.link_dropped


async def test_next_returns_none_when_nothing_arrives_in_time(plane, namespace) -> None:
    # The silent subscriber shares the plane's connection: the server handles one
    # connection's SUB before its PUB, with no flush at all.
    silent = await plane.connection.client.subscribe(f"{namespace}.silent")
    reply = await plane.open(f"{namespace}.silent", GenerateRequest(request_id="r", model="m"))
    assert await reply.next(0.1) is None
    reply.close()
    await silent.unsubscribe()


async def test_ping_tells_live_from_absent(plane, echo, namespace) -> None:
    subject, _seen = echo
    # Generous: a live subject answers at once, an absent one with NATS's no-responders
    # status at once; the timeout only bounds a loaded machine (2 s once failed in CI-like load).
    assert await plane.ping(subject, 30)
    assert not await plane.ping(f"{namespace}.nobody", 30)


async def test_cancel_reaches_the_instance(plane, echo) -> None:
    subject, seen = echo
    plane.cancel(subject, "r9")
    async with asyncio.timeout(30):  # at once normally; 5 s once ran out on a loaded machine
        while CancelRequest(request_id="r9") not in seen:
            await asyncio.sleep(0.01)
