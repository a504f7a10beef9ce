"""NATS settings from the environment: server lists, one way to authenticate, files that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorafleet.discovery.errors import NatsSettingsError
from lorafleet.discovery.nats_settings import NatsSettings, parse_nats_servers


def test_a_comma_separated_list_becomes_every_server() -> None:
    servers = parse_nats_servers(" nats://a:4222, b:4223 ,tls://c:4224")
    assert servers == ("nats://a:4222", "nats://b:4223", "tls://c:4224")


@pytest.mark.parametrize("text", ["", " , ", "http://a:4222", "nats://"])
def test_a_bad_server_list_names_nats_server(text: str) -> None:
    with pytest.raises(NatsSettingsError, match="NATS_SERVER"):
        parse_nats_servers(text)


def test_a_flag_wins_over_the_environment() -> None:
    env = {"NATS_SERVER": "nats://env:4222"}
    assert NatsSettings.from_env("nats://flag:4222", env).servers == ("nats://flag:4222",)
    assert NatsSettings.from_env(None, env).servers == ("nats://env:4222",)


def test_credentials_come_from_dynamos_variables_and_stay_out_of_repr() -> None:
    env = {"NATS_AUTH_USERNAME": "frontend", "NATS_AUTH_PASSWORD": "s3cret-pw"}
    settings = NatsSettings.from_env(None, env)
    assert settings.connect_options() == {"user": "frontend", "password": "s3cret-pw"}
    assert "s3cret-pw" not in repr(settings)
    token = NatsSettings.from_env(None, {"NATS_AUTH_TOKEN": "t0ken-value"})
    assert token.connect_options() == {"token": "t0ken-value"}
    assert "t0ken-value" not in repr(token)


def test_a_password_in_the_url_never_reaches_messages() -> None:
    settings = NatsSettings(servers=("nats://u:hunter2@a:4222",))
    assert settings.servers_text == "nats://a:4222"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"NATS_AUTH_USERNAME": "u"}, "NATS_AUTH_PASSWORD"),
        ({"NATS_AUTH_TOKEN": "t", "NATS_AUTH_NKEY": "SU..."}, "not several"),
        ({"NATS_TLS_CLIENT_CERT_PATH": __file__}, "NATS_TLS_CLIENT_KEY_PATH"),
        ({"NATS_TLS_CA_CERT_PATH": "/nonexistent/ca.pem"}, "NATS_TLS_CA_CERT_PATH"),
        ({"NATS_AUTH_CREDENTIALS_FILE": "/nonexistent.creds"}, "NATS_AUTH_CREDENTIALS_FILE"),
    ],
)
def test_contradictory_or_missing_settings_name_the_variable(
    env: dict[str, str], names: str
) -> None:
    with pytest.raises(NatsSettingsError, match=names):
        NatsSettings.from_env(None, env)


def test_a_ca_file_that_is_not_a_certificate_names_the_variable(tmp_path: Path) -> None:
    not_a_cert = tmp_path / "ca.pem"
    not_a_cert.write_text("hello")
    settings = NatsSettings(tls_ca_cert=not_a_cert)
    with pytest.raises(NatsSettingsError, match="NATS_TLS_CA_CERT_PATH"):
        settings.connect_options()
