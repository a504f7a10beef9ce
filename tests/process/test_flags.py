"""Flags that an environment variable can also set: the worker's and the frontend's."""

from __future__ import annotations

import pytest

from lorafleet.frontend.__main__ import build_parser, config_from_args, main
from lorafleet.worker.config import parse_worker_args


def test_the_environment_sets_a_flag_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_SYSTEM_PORT", "9400")
    monkeypatch.setenv("DYN_NAMESPACE", "team-a")
    assert parse_worker_args(["--model", "m"]).system_port == 9400
    config = parse_worker_args(["--model", "m", "--system-port", "9500"])
    assert (config.system_port, config.namespace) == (9500, "team-a")


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_HTTP_PORT", "")
    monkeypatch.setenv("ETCD_ENDPOINTS", "")
    config = config_from_args(build_parser().parse_args([]))
    assert config.http_port == 8000
    assert config.etcd.endpoints == ("http://127.0.0.1:2379",)


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("DYN_SYSTEM_PORT", "soon", "not a valid --system-port"),
        ("DYN_CONNECT_TIMEOUT_S", "soon", "not a valid --connect-timeout-s"),
        ("DYN_ENGINE", "tgi", "choose from ['hf', 'mocker', 'vllm']"),
    ],
)
def test_a_bad_variable_is_one_usage_line_naming_it(
    variable: str,
    value: str,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exit_info:
        parse_worker_args(["--model", "m"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{variable}='{value}'" in err and says in err
    assert "Traceback" not in err


def test_a_bad_router_variable_stops_the_frontend(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DYN_ROUTER_MODE", "random")
    with pytest.raises(SystemExit):
        main([])
    assert "DYN_ROUTER_MODE='random' is not a valid --router" in capsys.readouterr().err
