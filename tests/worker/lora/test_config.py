"""LoRAManagerConfig: the DYN_LORA_* variables, validated once, with errors that name them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lorafleet.worker.lora import LoraConfigError, LoRAManager, LoRAManagerConfig


def test_defaults_cache_under_home_and_allow_every_scheme() -> None:
    config = LoRAManagerConfig.from_env({})

    assert config.cache_dir == Path("~/.cache/lorafleet/loras").expanduser()
    assert config.allowed_schemes is None and config.cache_max_bytes is None
    assert config.file_roots == () and config.sources == ()


def test_every_variable_is_read(tmp_path: Path) -> None:
    env = {
        "DYN_LORA_PATH": str(tmp_path / "loras"),
        "DYN_LORA_FILE_ROOTS": f"/models{os.pathsep}/data/adapters",
        "DYN_LORA_ALLOWED_SCHEMES": "file, S3,demo",
        "DYN_LORA_CACHE_MAX_BYTES": "10_000_000",
        "DYN_LORA_SOURCES": "demo=pkg.mod:Source, demo=pkg.other:make",
    }

    config = LoRAManagerConfig.from_env(env)

    assert config.cache_dir == tmp_path / "loras"
    assert config.file_roots == (Path("/models"), Path("/data/adapters"))
    assert config.allowed_schemes == {"file", "s3", "demo"}
    assert config.cache_max_bytes == 10_000_000
    assert config.sources == (("demo", "pkg.mod:Source"), ("demo", "pkg.other:make"))


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"DYN_LORA_CACHE_MAX_BYTES": "10GB"}, "DYN_LORA_CACHE_MAX_BYTES"),
        ({"DYN_LORA_SOURCES": "demo=no_colon"}, "DYN_LORA_SOURCES"),
        ({"DYN_LORA_FILE_ROOTS": "relative/path"}, "DYN_LORA_FILE_ROOTS"),
        (
            {"DYN_LORA_ALLOWED_SCHEMES": "file", "DYN_LORA_SOURCES": "demo=a:b"},
            "DYN_LORA_ALLOWED_SCHEMES",
        ),
    ],
)
def test_bad_settings_fail_at_construction_naming_the_variable(
    env: dict[str, str], names: str
) -> None:
    with pytest.raises(LoraConfigError, match=names) as caught:
        LoRAManagerConfig.from_env(env)

    assert caught.value.code == "invalid_request"


def test_source_module_that_cannot_be_imported_fails_at_start(tmp_path: Path) -> None:
    env = {"DYN_LORA_PATH": str(tmp_path), "DYN_LORA_SOURCES": "demo=no_such_module_xyz:Source"}

    with pytest.raises(LoraConfigError, match="cannot load 'no_such_module_xyz:Source'"):
        LoRAManager.from_env(env)


def test_configured_attribute_that_is_not_a_source_is_refused(tmp_path: Path) -> None:
    env = {"DYN_LORA_PATH": str(tmp_path), "DYN_LORA_SOURCES": "demo=json:dumps"}

    with pytest.raises(LoraConfigError, match="without arguments failed"):
        LoRAManager.from_env(env)
    env["DYN_LORA_SOURCES"] = "demo=json:decoder"
    with pytest.raises(LoraConfigError, match="no async download"):
        LoRAManager.from_env(env)
