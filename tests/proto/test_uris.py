"""``public_uri``: what a caller without a token may see of an adapter's or model's source."""

from __future__ import annotations

import pytest

from proto.uris import public_uri


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        ("file:///srv/secret-team/adapters/pirate", "file:///***/pirate"),
        ("file:///srv/adapters/pirate/", "file:///***/pirate"),
        ("/root/.cache/lorafleet/demo/base", "file:///***/base"),
        ("~/models/demo", "file:///***/demo"),
        ("file:///", "file:///***"),
    ],
)
def test_paths_on_a_worker_s_disk_keep_only_their_last_segment(source: str, shown: str) -> None:
    assert public_uri(source) == shown


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        ("s3://bucket/adapters/pirate", "s3://bucket/adapters/pirate"),
        ("https://user:pw@host/a?sig=abc", "https://***@host/a?sig=***"),
        ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B"),
        ("demo", "demo"),
    ],
)
def test_remote_sources_and_hub_ids_are_shown_without_secrets(source: str, shown: str) -> None:
    assert public_uri(source) == shown
