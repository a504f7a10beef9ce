"""One declaration per setting: the flag, the variable, ``--help``, the check and the README
row of a setting all come from its config field, so they cannot drift apart."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from lorafleet.frontend.__main__ import build_parser as frontend_parser
from lorafleet.frontend.__main__ import config_from_args
from lorafleet.frontend.__main__ import main as frontend_main
from lorafleet.frontend.config import FrontendConfig
from lorafleet.process.settings_cli import setting_rows
from lorafleet.worker.config import WorkerConfig, parse_worker_args
from lorafleet.worker.config import build_parser as worker_parser
from lorafleet.worker.placement import PlacementSettings

ROOT = Path(__file__).resolve().parents[2]


def test_a_placement_flag_and_its_variable_reach_the_placement_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DYN_LORA_COPY_COOLDOWN_S", "7")
    config = parse_worker_args(["--model", "m", "--lora-copy-rps", "2.5"])
    assert config.placement == PlacementSettings(copy_rps=2.5, cooldown_s=7.0)


def test_a_bad_value_is_refused_once_at_construction_naming_flag_and_variable() -> None:
    with pytest.raises(ValueError, match=r"--lora-copy-rps \(DYN_LORA_COPY_RPS\) must be > 0"):
        PlacementSettings(copy_rps=0)


def test_a_bad_placement_variable_is_one_usage_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DYN_LORA_IN_USE_S", "-1")
    with pytest.raises(SystemExit) as exit_info:
        parse_worker_args(["--model", "m"])
    assert exit_info.value.code == 2
    assert "--lora-in-use-s (DYN_LORA_IN_USE_S) must be >= 0" in capsys.readouterr().err


def test_a_missing_model_names_its_flag_and_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DYN_MODEL", raising=False)
    with pytest.raises(SystemExit):
        parse_worker_args([])
    assert "--model (DYN_MODEL) is required" in capsys.readouterr().err


def test_engine_options_are_json_and_the_mocker_delay_is_a_setting() -> None:
    config = parse_worker_args(["--model", "m", "--mocker-time-per-token-s", "0.5",
                                "--engine-option", "output_tokens=3",
                                "--engine-option", "fail_add_adapter=broken.*"])  # fmt: skip
    engine = config.engine_config
    assert engine.mocker_time_per_token_s == 0.5
    assert engine.options == {"output_tokens": 3, "fail_add_adapter": "broken.*"}


@pytest.mark.parametrize(
    ("config", "parser"), [(WorkerConfig, worker_parser), (FrontendConfig, frontend_parser)]
)
def test_every_flag_in_help_has_a_readme_row(config: type, parser: object) -> None:
    built = parser()  # type: ignore[operator]
    flags = {option for action in built._actions for option in action.option_strings
             if option.startswith("--") and option not in ("--help", "--version")}  # fmt: skip
    rows = {row.flag.strip("`") for row in setting_rows(config)}
    assert flags == rows - {""}
    readme = (ROOT / "README.md").read_text()
    assert all(f"| `{flag}` |" in readme for flag in flags)


def test_the_readme_table_is_the_one_the_declarations_give() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "settings_table.py"),
                             "--check"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_secrets_have_no_flag_and_stay_out_of_repr() -> None:
    config = FrontendConfig(admin_token="s3cret-admin", worker_token="s3cret-worker")
    assert "s3cret" not in repr(config)
    help_text = " ".join(frontend_parser().format_help().split())
    assert not re.search(r"--admin-token|--worker-token", help_text)


def test_a_secret_comes_from_its_variable_else_from_the_file_its_FILE_variable_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    token_file = tmp_path / "admin_token"
    token_file.write_text("from-the-file\n")
    monkeypatch.setenv("DYN_ADMIN_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("DYN_ADMIN_TOKEN", "")  # empty: unset, as compose passes it
    assert config_from_args(frontend_parser().parse_args([])).admin_token == "from-the-file"
    monkeypatch.setenv("DYN_ADMIN_TOKEN", "from-the-variable")
    assert config_from_args(frontend_parser().parse_args([])).admin_token == "from-the-variable"


def test_an_unreadable_secret_file_stops_the_frontend_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DYN_ADMIN_TOKEN", raising=False)
    monkeypatch.setenv("DYN_ADMIN_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(SystemExit):
        frontend_main([])
    assert "DYN_ADMIN_TOKEN_FILE=" in capsys.readouterr().err


def test_a_bool_variable_that_is_not_a_true_or_false_word_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DYN_LORA_ENABLED", "ture")  # once silently off
    with pytest.raises(SystemExit):
        parse_worker_args(["--model", "m"])
    assert "DYN_LORA_ENABLED='ture' is not valid: must be true or false" in capsys.readouterr().err
    monkeypatch.setenv("DYN_LORA_ENABLED", " Yes ")
    assert parse_worker_args(["--model", "m"]).lora_enabled
