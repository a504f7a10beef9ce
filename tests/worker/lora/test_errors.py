"""LoRA errors: wire codes by kind, and URIs in messages stripped of secrets."""

from __future__ import annotations

import pytest

from lorafleet.proto.errors import error_from_info
from lorafleet.worker.lora.errors import (
    LoraInvalidAdapterError,
    LoraInvalidUriError,
    LoraNotFoundError,
    LoraSourceError,
    LoraUnavailableError,
)


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (LoraInvalidUriError, "invalid_request"),
        (LoraInvalidAdapterError, "invalid_request"),
        (LoraNotFoundError, "not_found"),
        (LoraUnavailableError, "unavailable"),
    ],
)
def test_each_kind_crosses_the_wire_with_its_code(cls: type[LoraSourceError], code: str) -> None:
    error = cls("s3://b/p", "something", hint="do this")

    rebuilt = error_from_info(error.to_info())

    assert error.code == code and rebuilt.code == code
    assert rebuilt.message == "LoRA source s3://b/p: something; do this"


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        (
            "https://user:pw@host/a?X-Amz-Signature=abc&v=1",
            "https://***@host/a?X-Amz-Signature=***&v=***",
        ),
        ("hf://ghp_token@host/org/adapter", "hf://***@host/org/adapter"),
        ("s3://bucket/prefix", "s3://bucket/prefix"),
    ],
)
def test_messages_never_show_user_info_or_query_values(uri: str, shown: str) -> None:
    error = LoraNotFoundError(uri, "missing")

    assert error.uri == shown and shown in error.message
