"""``split_uri``, the one scheme parser, and ``public_uri``: what a caller without a token
may see of an adapter's or model's source."""

from __future__ import annotations

import pytest

from lorafleet.proto.uris import public_uri, public_uris_in, split_uri


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


@pytest.mark.parametrize(
    ("uri", "parts"),
    [
        ("s3://bucket/prefix", ("s3", "bucket/prefix")),
        ("S3://bucket/prefix", ("s3", "bucket/prefix")),
        ("hf+git://org/name@main", ("hf+git", "org/name@main")),
        ("file:///srv/adapters/pirate", ("file", "/srv/adapters/pirate")),
    ],
)
def test_split_uri_lower_cases_the_scheme_and_keeps_the_rest(
    uri: str, parts: tuple[str, str]
) -> None:
    assert split_uri(uri) == parts


@pytest.mark.parametrize("uri", ["/srv/pirate", "org/pirate", "s3://", "1x://a", "://a", ""])
def test_split_uri_refuses_what_has_no_scheme_or_no_location(uri: str) -> None:
    assert split_uri(uri) is None


def test_public_uris_in_rewrites_every_uri_of_a_message_and_nothing_else() -> None:
    message = "LoRA source file:///data/org/ghost: no such file; s3://b/k?sig=x failed too"
    assert public_uris_in(message) == (
        "LoRA source file:///***/ghost: no such file; s3://b/k?sig=*** failed too"
    )


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        (
            "adapter 'big' at /tmp/pytest-1/ad/bigrank has rank 128",
            "adapter 'big' at ***/bigrank has rank 128",
        ),
        ("cannot load model '/home/me/models/demo/': bad", "cannot load model '***/demo': bad"),
        (
            "LoRA source file:///data/ad/x: gone (/data/ad/x)",
            "LoRA source file:///***/x: gone (***/x)",
        ),
        ("see ~/.cache/lorafleet/loras", "see ***/loras"),
        ("rank 8 of 16 tokens/s at 1/2", "rank 8 of 16 tokens/s at 1/2"),
    ],
)
def test_public_uris_in_hides_bare_paths_too(message: str, shown: str) -> None:
    assert public_uris_in(message) == shown
