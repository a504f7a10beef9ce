"""vLLM's KV events re-hashed into the fleet's chain, from synthetic events shaped like vLLM's.

vLLM cannot run here (no GPU; its CPU wheel lives in another venv), so these Structs copy the
wire shape of ``vllm.distributed.kv_events`` (tagged by class name, msgpack); the real path
is checked by ``bench/vllm_kv_check.py`` on a GPU machine.
"""

from __future__ import annotations

import msgspec

from lorafleet.fleet.kv_blocks import block_hashes
from lorafleet.proto.kv_events import BlocksRemoved, BlocksStored, KvEvent, VersionCleared
from lorafleet.worker.engines._vllm_kv_events import VllmKvEvents

BASE, PIRATE = "demo", "pirate@sha256:0a1b"
TOKENS = list(range(100, 164))  # four blocks of 16


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = "GPU"
    lora_name: str | None = None
    extra_keys: list[tuple[object, ...] | None] | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[bytes]
    medium: str | None = "GPU"


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


class KVEventBatch(msgspec.Struct, omit_defaults=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


decode = msgspec.msgpack.Decoder(KVEventBatch).decode


def _relay() -> tuple[VllmKvEvents, list[KvEvent]]:
    sent: list[KvEvent] = []

    def version_of(lora_id: int | None, lora_name: str | None) -> str | None:
        return {None: BASE, 0: BASE, 7: PIRATE}.get(lora_id)

    return VllmKvEvents(version_of=version_of, sink=sent.append), sent


def _send(relay: VllmKvEvents, *events: object) -> None:
    relay.on_message(msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=list(events))), decode)


def _stored(hashes: list[bytes], parent: bytes | None, tokens: list[int], **more) -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                       block_size=16, lora_id=more.pop("lora_id", None), **more)  # fmt: skip


def test_a_chain_stored_in_two_events_gets_the_fleets_hashes_of_the_whole_prompt() -> None:
    relay, sent = _relay()
    _send(relay, _stored([b"e1", b"e2"], None, TOKENS[:32], lora_id=7),
          _stored([b"e3", b"e4"], b"e2", TOKENS[32:], lora_id=7))  # fmt: skip
    ours = block_hashes(TOKENS, 16, PIRATE)
    assert sent == [BlocksStored(version=PIRATE, hashes=ours[:2]),
                    BlocksStored(version=PIRATE, hashes=ours[2:])]  # fmt: skip


def test_the_cache_salt_in_vllms_extra_keys_salts_the_chain() -> None:
    relay, sent = _relay()
    extra = [("pirate@0a1b", "tenant-a"), ("pirate@0a1b",)]
    _send(relay, _stored([b"e1", b"e2"], None, TOKENS[:32], lora_id=7, lora_name="pirate@0a1b",
                         extra_keys=extra))  # fmt: skip
    assert sent == [BlocksStored(version=PIRATE, hashes=block_hashes(TOKENS[:32], 16, PIRATE,
                                                                     "tenant-a"))]  # fmt: skip


def test_removals_name_our_hashes_by_version_and_a_reset_clears_everything() -> None:
    relay, sent = _relay()
    removed = BlockRemoved(block_hashes=[b"b1", b"p1", b"never-stored"])
    _send(relay, _stored([b"b1"], None, TOKENS[:16]),
          _stored([b"p1"], None, TOKENS[:16], lora_id=7), removed, AllBlocksCleared())  # fmt: skip
    base, pirate = block_hashes(TOKENS[:16], 16, BASE), block_hashes(TOKENS[:16], 16, PIRATE)
    assert base != pirate
    assert sent[2:] == [
        BlocksRemoved(version=BASE, hashes=base),
        BlocksRemoved(version=PIRATE, hashes=pirate),
        VersionCleared(version=""),
    ]


def test_events_of_an_unknown_adapter_or_parent_and_bad_messages_are_dropped_not_fatal() -> None:
    relay, sent = _relay()
    relay.on_message(b"\xc1 not msgpack", decode)
    _send(relay, _stored([b"x"], None, TOKENS[:16], lora_id=99),  # an adapter no longer held
          _stored([b"y"], b"unknown", TOKENS[:16]),               # a parent never relayed
          _stored([b"z1", b"z2"], None, TOKENS[:20]),             # tokens do not fill 2 blocks
          _stored([b"ok"], None, TOKENS[:16]))  # fmt: skip
    assert sent == [BlocksStored(version=BASE, hashes=block_hashes(TOKENS[:16], 16, BASE))]


def test_a_cleared_version_leaves_and_its_later_removals_say_nothing() -> None:
    relay, sent = _relay()
    _send(relay, _stored([b"p1"], None, TOKENS[:16], lora_id=7))
    relay.clear(PIRATE)
    _send(relay, BlockRemoved(block_hashes=[b"p1"]))
    assert sent[1:] == [VersionCleared(version=PIRATE)]
