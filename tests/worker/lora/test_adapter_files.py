"""Adapter validation: what may enter the cache (and what a file:// adapter must hold)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lorafleet.fleet.adapter_files import adapter_problem, check_adapter_rank
from lorafleet.proto.errors import InvalidRequestError


def test_complete_adapter_passes(tmp_path: Path, make_adapter: Callable[..., Path]) -> None:
    assert adapter_problem(make_adapter(tmp_path / "a")) is None


def test_bin_weights_pass_instead_of_safetensors(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "m"}))
    (tmp_path / "adapter_model.bin").write_bytes(b"PK\x03\x04 torch zip")

    assert adapter_problem(tmp_path) is None


def test_truncated_safetensors_is_caught(
    tmp_path: Path, make_adapter: Callable[..., Path], adapter_bytes: Callable[..., Any]
) -> None:
    files = adapter_bytes()
    files["adapter_model.safetensors"] = files["adapter_model.safetensors"][:-100]

    problem = adapter_problem(make_adapter(tmp_path / "a", files))

    assert problem is not None and "truncated" in problem


def test_weights_that_are_not_safetensors_by_their_bytes_are_refused_empty_ones_too(
    tmp_path: Path,
) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    weights = tmp_path / "adapter_model.safetensors"
    weights.write_bytes(b"\x00" * 16)  # no header at all

    assert adapter_problem(tmp_path) == (
        "adapter_model.safetensors is not a safetensors file (its first 8 bytes declare a "
        "header of 0 bytes, not 1 to 100000000)"
    )
    weights.write_bytes(b"")
    assert adapter_problem(tmp_path) == "adapter_model.safetensors is empty"


def test_safetensors_cut_inside_its_header_is_caught(
    tmp_path: Path, make_adapter: Callable[..., Path], adapter_bytes: Callable[..., Any]
) -> None:
    files = adapter_bytes()
    files["adapter_model.safetensors"] = files["adapter_model.safetensors"][:40]

    problem = adapter_problem(make_adapter(tmp_path / "a", files))

    assert problem == "adapter_model.safetensors is truncated (in its header)"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"r": 8}', "names neither base_model_name_or_path nor peft_type"),
    ],
)
def test_config_must_parse_and_name_a_base_model_or_peft_type(
    tmp_path: Path,
    make_adapter: Callable[..., Path],
    adapter_bytes: Callable[..., Any],
    config: bytes,
    expected: str,
) -> None:
    files = {**adapter_bytes(), "adapter_config.json": config}

    problem = adapter_problem(make_adapter(tmp_path / "a", files))

    assert problem is not None and expected in problem


def _config_dir(path: Path, **config: object) -> Path:
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


def test_adapter_within_the_rank_limit_passes_the_engines_check(tmp_path: Path) -> None:
    check_adapter_rank("pirate", _config_dir(tmp_path, r=8, rank_pattern={}), max_rank=8)


def test_adapter_whose_rank_exceeds_the_limit_is_refused_naming_both(tmp_path: Path) -> None:
    path = _config_dir(tmp_path, r=8, rank_pattern={"q_proj": 32})
    with pytest.raises(InvalidRequestError, match=r"rank 32.*at most 16"):
        check_adapter_rank("big", path, max_rank=16)


def test_directory_without_adapter_config_fails_the_engines_check(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match=r"adapter_config\.json is missing"):
        check_adapter_rank("ghost", tmp_path, max_rank=8)


def test_an_adapter_of_another_peft_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="not a LoRA"):
        check_adapter_rank("ia3", _config_dir(tmp_path, peft_type="IA3"), max_rank=8)
