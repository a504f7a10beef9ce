"""``EtcdSettings``: the ETCD_* variables read once, with a clear error for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorafleet.discovery.settings import EtcdSettings, parse_endpoints


def test_endpoint_lists_are_split_and_normalised() -> None:
    assert parse_endpoints("http://a:1, b ,https://[::1]:3,") == (
        "http://a:1", "http://b:2379", "https://[::1]:3",
    )  # fmt: skip


@pytest.mark.parametrize("bad", ["", " , ", "ftp://a:1", "http://:2379"])
def test_an_endpoint_list_without_a_usable_url_names_etcd_endpoints(bad: str) -> None:
    with pytest.raises(ValueError, match="ETCD_ENDPOINTS"):
        parse_endpoints(bad)


def test_from_env_reads_every_variable_and_the_flag_wins(tmp_path: Path) -> None:
    for name in ("ca.crt", "client.crt", "client.key"):
        (tmp_path / name).write_text("pem")
    env = {
        "ETCD_ENDPOINTS": "https://env:2379", "ETCD_AUTH_USERNAME": "u",
        "ETCD_AUTH_PASSWORD": "p", "ETCD_AUTH_CA": str(tmp_path / "ca.crt"),
        "ETCD_AUTH_CLIENT_CERT": str(tmp_path / "client.crt"),
        "ETCD_AUTH_CLIENT_KEY": str(tmp_path / "client.key"),
    }  # fmt: skip
    settings = EtcdSettings.from_env(env, endpoints="https://a:1,https://b:2")
    assert settings.endpoints == ("https://a:1", "https://b:2") and settings.tls
    assert (settings.username, settings.password) == ("u", "p")
    assert settings.ca_path == tmp_path / "ca.crt"
    assert EtcdSettings.from_env(settings.env()) == settings  # children get the same


def test_the_password_never_shows_in_repr() -> None:
    settings = EtcdSettings(username="u", password="s3cret-value")
    assert "s3cret-value" not in repr(settings)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ETCD_AUTH_USERNAME": "u"}, "ETCD_AUTH_USERNAME and ETCD_AUTH_PASSWORD"),
        ({"ETCD_AUTH_CLIENT_KEY": "/k"}, "ETCD_AUTH_CLIENT_CERT and ETCD_AUTH_CLIENT_KEY"),
        ({"ETCD_AUTH_CA": "/ca.crt"}, "ETCD_AUTH_CA is set but ETCD_ENDPOINTS are not https"),
        ({"ETCD_ENDPOINTS": "https://a,http://b"}, "mixes http:// and https://"),
        ({"ETCD_ENDPOINTS": "https://a", "ETCD_AUTH_CA": "/nowhere/ca.crt"},
         "ETCD_AUTH_CA '/nowhere/ca.crt' is not a readable file"),
    ],
)  # fmt: skip
def test_each_mistake_is_a_value_error_naming_the_variable(env: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EtcdSettings.from_env(env)
