"""LoRAManagerConfig: the DYN_LORA_* variables, declared once, read by the worker and by
Dynamo's ``LoRAManager()``, validated once, with errors that name them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lorafleet.launch.local_servers import free_port
from lorafleet.process.settings import declared
from lorafleet.worker.config import parse_worker_args
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


BAD_VALUES = [
    ("DYN_LORA_FILE_ROOTS", "relative/path"),
    ("DYN_LORA_ALLOWED_SCHEMES", "file,not a scheme"),
    ("DYN_LORA_CACHE_MAX_BYTES", "10GB"),
    ("DYN_LORA_SOURCES", "demo=no_colon"),
    ("DYN_LORA_DOWNLOAD_TIMEOUT_S", "-1"),
    ("DYN_LORA_MAX_BYTES", "1e9"),
    ("DYN_LORA_ALLOW_PICKLE", "maybe"),
]
"""A bad text of every variable but ``DYN_LORA_PATH`` (any text is a path; a cache that cannot
be made fails when the manager starts, tests/worker/lora/test_lora_manager.py)."""


def test_every_variable_but_the_path_has_a_bad_value_tested() -> None:
    variables = {item.spec.env for item in declared(LoRAManagerConfig) if item.spec}
    assert variables - {"DYN_LORA_PATH"} == {variable for variable, _ in BAD_VALUES}


@pytest.mark.parametrize(("variable", "bad"), BAD_VALUES)
def test_a_bad_variable_stops_the_worker_at_start_with_one_line_naming_it(
    variable: str, bad: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(variable, bad)  # LoRA off: a bad setting is refused all the same
    with pytest.raises(SystemExit) as exit_info:
        parse_worker_args(["--model", "m"])
    assert exit_info.value.code == 2
    assert f"{variable}" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize(
    ("env", "names"),
    [
        *(({variable: bad}, variable) for variable, bad in BAD_VALUES),
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


def test_the_worker_reads_the_variables_into_its_lora_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {"DYN_LORA_PATH": str(tmp_path), "DYN_LORA_MAX_BYTES": "4_096",
           "DYN_LORA_ALLOW_PICKLE": "yes", "DYN_LORA_DOWNLOAD_TIMEOUT_S": "600"}  # fmt: skip
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)

    config = parse_worker_args(["--model", "m"]).lora

    assert config == LoRAManagerConfig.from_env(env)
    assert (config.cache_dir, config.max_adapter_bytes) == (tmp_path, 4096)
    assert config.allow_pickle and config.download_timeout_s == 600.0


def test_a_worker_process_with_a_bad_variable_exits_2_before_connecting() -> None:
    env = {**os.environ, "DYN_LORA_MAX_BYTES": "10GB", "DYN_CONNECT_TIMEOUT_S": "1",
           "NATS_SERVER": f"nats://127.0.0.1:{free_port()}"}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "lorafleet.worker", "--model", "demo"],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert "DYN_LORA_MAX_BYTES='10GB' is not valid" in done.stderr
    assert "Traceback" not in done.stderr


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
