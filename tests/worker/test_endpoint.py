"""Updates over NATS on a real mocker worker need the worker's token, as its HTTP routes do.

An anonymous NATS client that found the instance subject in etcd must get the
same refusal whatever URI it names: no adapter loaded, nothing about the
worker's files revealed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest

from lorafleet.process.auth import bearer_header
from lorafleet.proto.adapters import LoadLoraRequest, LoraSource
from lorafleet.proto.discovery import decode_card, decode_instance
from lorafleet.proto.inference import UpdateReply, UpdateRequest, encode_msg
from tests.worker.adapters import make_adapter_dir

TOKEN = "s3cret-worker-token"


@pytest.fixture
async def guarded_subject(worker_factory, etcd, namespace: str, tmp_path: Path) -> str:
    """The instance subject of a LoRA worker whose ``DYN_SYSTEM_AUTH_TOKEN`` is set."""
    env = {
        "DYN_LORA_ENABLED": "true",
        "DYN_LORA_PATH": str(tmp_path / "cache"),
        "DYN_SYSTEM_AUTH_TOKEN": TOKEN,
    }
    worker_factory("--enable-lora", env=env)
    (instance_kv,) = list(await etcd.get_prefix(f"v1/instances/{namespace}/".encode()))
    return decode_instance(instance_kv.value).subject


@pytest.fixture
async def anonymous(nats_url: str) -> AsyncIterator[nats.aio.client.Client]:
    """A NATS client that knows nothing but the server's address."""
    client = await nats.connect(nats_url)
    yield client
    await client.close()


async def _update(
    nc: nats.aio.client.Client, subject: str, name: str, body: dict, token: str | None = None
) -> UpdateReply:
    message = encode_msg(UpdateRequest(name=name, body=body))
    reply = await nc.request(subject, message, timeout=10, headers=bearer_header(token))
    return msgspec.msgpack.decode(reply.data, type=UpdateReply)


def _load(name: str, uri: str) -> dict:
    return {"lora_name": name, "source": {"uri": uri}}


async def _adapter_cards(etcd, namespace: str) -> list[str]:
    cards = [decode_card(kv.value) for kv in await etcd.get_prefix(f"v1/mdc/{namespace}/".encode())]
    return [card.lora.name for card in cards if card.lora is not None]


async def test_update_without_the_token_is_refused_before_any_file_is_read(
    guarded_subject, anonymous, etcd, namespace, tmp_path
) -> None:
    real = f"file://{make_adapter_dir(tmp_path / 'adapters', 'pirate')}"
    probes = [real, "file:///proc/self/environ", f"file://{tmp_path}/nowhere"]
    answers = [
        await _update(anonymous, guarded_subject, "update/load_lora", _load("pirate", uri), token)
        for uri in probes
        for token in (None, "wrong-token")
    ]
    answers.append(await _update(anonymous, guarded_subject, "update/list_loras", {}))

    assert {answer.status_code for answer in answers} == {401}
    assert len({msgspec.json.encode(answer.body) for answer in answers[:-1]}) == 1  # no probing
    body = answers[0].body
    assert body["code"] == "unauthorized"
    assert "DYN_SYSTEM_AUTH_TOKEN" in body["message"]
    assert TOKEN not in body["message"]
    assert await _adapter_cards(etcd, namespace) == []
    loaded = await _update(anonymous, guarded_subject, "update/list_loras", {}, TOKEN)
    assert loaded.body["loras"] == {}


async def test_a_typed_update_loads_the_adapter_and_one_for_another_update_changes_nothing(
    guarded_subject, anonymous, etcd, namespace, tmp_path
) -> None:
    """A frontend that sends only ``update`` (the tagged union, no JSON object body)."""
    uri = f"file://{make_adapter_dir(tmp_path / 'adapters', 'pirate')}"
    load = LoadLoraRequest(lora_name="pirate", source=LoraSource(uri=uri))

    async def send(name: str) -> UpdateReply:
        message = encode_msg(UpdateRequest(name=name, update=load))
        reply = await anonymous.request(guarded_subject, message, timeout=10,
                                        headers=bearer_header(TOKEN))  # fmt: skip
        return msgspec.msgpack.decode(reply.data, type=UpdateReply)

    wrong = await send("update/unload_lora")
    assert wrong.status_code == 400, wrong.body
    assert (
        "LoadLoraRequest body was sent to the update that takes UnloadLoraRequest"
        in (wrong.body["message"])
    )
    assert await _adapter_cards(etcd, namespace) == []

    answer = await send("update/load_lora")
    assert answer.status_code == 200, answer.body
    assert await _adapter_cards(etcd, namespace) == ["pirate"]


async def test_update_with_the_token_loads_the_adapter(
    guarded_subject, anonymous, etcd, namespace, tmp_path
) -> None:
    uri = f"file://{make_adapter_dir(tmp_path / 'adapters', 'pirate')}"

    load = _load("pirate", uri)
    answer = await _update(anonymous, guarded_subject, "update/load_lora", load, TOKEN)

    assert answer.status_code == 200, answer.body
    assert answer.body["lora_name"] == "pirate"
    assert await _adapter_cards(etcd, namespace) == ["pirate"]
