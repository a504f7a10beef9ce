"""One engine update (``load_lora``, ``unload_lora``) sent to one worker over NATS.

On-demand loads and vLLM's unload on the frontend reach workers this way, with
the workers' token (``DYN_SYSTEM_AUTH_TOKEN``) when one is set; the worker
answers what its status server would (``UpdateReply``).
"""

from __future__ import annotations

import msgspec

from lorafleet.frontend.dispatcher import DispatchSettings
from lorafleet.frontend.request_plane import RequestPlane
from lorafleet.proto.discovery import Instance
from lorafleet.proto.inference import UpdateReply, UpdateRequest

__all__ = ["send_update"]


async def send_update(
    plane: RequestPlane, instance: Instance, update: UpdateRequest, *,
    headers: dict[str, str] | None, settings: DispatchSettings,
) -> UpdateReply:  # fmt: skip
    """The worker's answer to ``update``; raises ``InstanceLostError`` when it is gone."""
    reply = await plane.open(instance.subject, update, headers=headers)
    try:
        return await reply.receive(_decode_update, instance.instance_id, settings)
    finally:
        reply.close()


def _decode_update(data: bytes) -> UpdateReply:
    return msgspec.msgpack.decode(data, type=UpdateReply)
