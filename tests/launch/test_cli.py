"""The ``lorafleet`` command line reads well: help on every flag, ``--version`` on every
command, plain-text descriptions, and errors as one line with an exit code.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from lorafleet.frontend.__main__ import build_parser as frontend_parser
from lorafleet.launch.cli import _parser as lorafleet_parser
from lorafleet.launch.cli import main as lorafleet
from lorafleet.launch.local_servers import free_port
from lorafleet.worker.config import build_parser as worker_parser

LORAFLEET = str(Path(sys.executable).parent / "lorafleet")
COMMANDS = [
    [],
    ["up"],
    ["lora"],
    ["keys"],
    ["tenants"],
    ["models"],
    ["status"],
    ["worker"],
    ["frontend"],
]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (choices,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(choices.choices)


def _parsers() -> dict[str, argparse.ArgumentParser]:
    main = lorafleet_parser()
    found = {"lorafleet": main, "worker": worker_parser(), "frontend": frontend_parser()}
    for name, sub in _subcommands(main).items():
        if name not in ("worker", "frontend"):  # stand-ins for the parsers above
            found[name] = sub
    return found


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "lorafleet")
def test_every_command_has_version(command: list[str]) -> None:
    result = subprocess.run([LORAFLEET, *command, "--version"], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("lorafleet") and "0." in result.stdout


@pytest.mark.parametrize("name", sorted(_parsers()))
def test_every_flag_has_help_and_descriptions_are_plain_text(name: str) -> None:
    parser = _parsers()[name]
    silent = [a.dest for a in parser._actions if not a.help]
    assert not silent, f"lorafleet {name}: flags without help: {silent}"
    assert "``" not in parser.format_help()


@pytest.mark.parametrize("name", ["up", "worker", "frontend"])
def test_flags_read_from_the_environment_name_their_variable(name: str) -> None:
    text = " ".join(_parsers()[name].format_help().split())
    assert "env DYN_NAMESPACE" in text
    assert "(default:" in text


def test_enable_lora_says_it_needs_the_second_switch() -> None:
    assert "DYN_LORA_ENABLED=true" in " ".join(worker_parser().format_help().split())


def test_lora_list_with_etcd_down_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    url = f"http://127.0.0.1:{free_port()}"
    code = lorafleet(["lora", "list", "--etcd-endpoints", url, "--state-dir", str(tmp_path)])
    assert code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("lorafleet lora list: etcd at") and url in line


def test_lora_load_without_a_uri_names_what_is_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert lorafleet(["lora", "load", "pirate"]) == 2
    assert capsys.readouterr().err.strip() == (
        "lorafleet lora load needs a URI (lorafleet lora --help)"
    )


def test_models_with_no_frontend_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert lorafleet(["models", "--url", url, "--state-dir", str(tmp_path)]) == 1
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"cannot list models at {url}")
