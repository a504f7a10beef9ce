"""The etcd key layout: what is built from an endpoint parses back to it."""

from __future__ import annotations

import pytest

from lorafleet.discovery.keys import (
    base_card_key,
    endpoint_path,
    instance_key,
    load_key,
    lora_card_key,
    parse_card_key,
    parse_load_key,
)

ENDPOINT = ("ns", "backend", "generate")


def test_every_key_of_an_instance_names_its_endpoint_path_and_id() -> None:
    path = endpoint_path(*ENDPOINT)
    assert path == "ns/backend/generate"
    for key in (instance_key(*ENDPOINT, 0xAB), load_key(*ENDPOINT, 0xAB)):
        assert key.endswith(f"/{path}/ab")


def test_a_load_record_key_parses_back_to_its_endpoint_and_instance() -> None:
    assert parse_load_key(load_key(*ENDPOINT, 0x1F)) == ("ns/backend/generate", 0x1F)


def test_a_card_key_parses_back_to_its_endpoint_instance_and_slug() -> None:
    assert parse_card_key(base_card_key(*ENDPOINT, 7)) == ("ns/backend/generate", 7, None)
    assert parse_card_key(lora_card_key(*ENDPOINT, 7, "pirate")) == (
        "ns/backend/generate", 7, "pirate"
    )  # fmt: skip


@pytest.mark.parametrize(
    "key",
    [
        "v1/load/ns/backend/generate",  # no instance
        "v1/load/ns/backend/generate/zz",  # not hex
        "v1/load/ns/backend/generate/1/extra",
        "v1/mdc/ns/backend/generate/1",  # a card, not a load record
    ],
)
def test_a_key_outside_the_load_layout_is_refused(key: str) -> None:
    with pytest.raises(ValueError):
        parse_load_key(key)
