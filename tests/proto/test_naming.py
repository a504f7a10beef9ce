"""lora_slug and lora_id: the design's test vectors and their properties."""

from __future__ import annotations

import pytest

from lorafleet.proto.naming import lora_id, lora_slug


@pytest.mark.parametrize(("name", "expected"), [("test_lora", 1983627077), ("my-lora", 868637996)])
def test_lora_id_matches_the_design_vectors(name: str, expected: int) -> None:
    assert lora_id(name) == expected


def test_lora_slug_is_readable_and_hash_suffixed() -> None:
    assert lora_slug("my-lora") == "my_lora_a2e1fff2"
    assert lora_slug("Org/Pirate.v2").startswith("org_pirate_v2_")


def test_slugs_of_names_that_read_the_same_differ() -> None:
    assert lora_slug("a-b") != lora_slug("a_b")
