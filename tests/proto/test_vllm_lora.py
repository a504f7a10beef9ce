"""vLLM's LoRA dialect in-process: how ``lora_path`` becomes a source URI, and vLLM's bodies."""

from __future__ import annotations

import msgspec
import pytest

from lorafleet.proto.errors import InvalidRequestError
from lorafleet.proto.vllm_lora import (
    LoadLoraAdapterRequest,
    lora_path_uri,
    vllm_error_for_code,
    vllm_success_message,
)


@pytest.mark.parametrize(
    ("lora_path", "uri"),
    [
        ("/adapters/sql", "file:///adapters/sql"),
        ("s3://bucket/sql", "s3://bucket/sql"),
        ("hf://org/sql@v2", "hf://org/sql@v2"),
        ("org/sql-lora", "hf://org/sql-lora"),  # a Hub id, as vLLM resolves it
    ],
)
def test_lora_path_becomes_a_source_uri(lora_path: str, uri: str) -> None:
    assert lora_path_uri(lora_path) == uri


@pytest.mark.parametrize("lora_path", ["adapters", "./sql", "a/b/c", "~/sql", "../sql"])
def test_relative_and_home_paths_are_refused_naming_lora_path(lora_path: str) -> None:
    with pytest.raises(InvalidRequestError, match="lora_path"):
        lora_path_uri(lora_path)


def test_vllm_load_body_decodes_with_vllm_field_names() -> None:
    raw = b'{"lora_name": "sql-lora", "lora_path": "/adapters/sql", "load_inplace": true}'
    body = msgspec.json.decode(raw, type=LoadLoraAdapterRequest)
    assert (body.lora_name, body.lora_path, body.load_inplace) == (
        "sql-lora", "/adapters/sql", True,
    )  # fmt: skip


def test_our_codes_keep_their_status_in_vllm_error_shape() -> None:
    body = msgspec.to_builtins(vllm_error_for_code("unavailable", "mirror down"))
    assert body == {
        "error": {"message": "mirror down", "type": "ServiceUnavailableError", "param": None,
                  "code": 503},
    }  # fmt: skip
    assert (
        vllm_success_message("x", loaded=False) == "Success: LoRA adapter 'x' removed successfully."
    )
