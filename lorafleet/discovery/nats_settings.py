"""How to reach NATS: the server list, credentials and TLS, read once from the environment.

The variable names are NVIDIA Dynamo's, so operators can move between the two.
Only parsing and validation here; ``nats_connection`` connects. Never log a secret:
the secret fields are left out of ``repr``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from lorafleet.discovery.errors import NatsSettingsError

__all__ = ["DEFAULT_NATS_SERVER", "NatsSettings", "parse_nats_servers"]

DEFAULT_NATS_SERVER: Final = "nats://127.0.0.1:4222"
_SCHEMES: Final = ("nats", "tls")


def parse_nats_servers(text: str) -> tuple[str, ...]:
    """The URLs of comma-separated ``NATS_SERVER``; ``host:port`` gets ``nats://``."""
    servers = []
    for item in text.split(","):
        url = item.strip()
        if not url:
            continue
        url = url if "://" in url else f"nats://{url}"
        parts = urlsplit(url)
        if parts.scheme not in _SCHEMES or not parts.hostname:
            raise NatsSettingsError(
                f"NATS_SERVER entry {_without_userinfo(url)!r} is not a nats:// or tls:// URL "
                "with a host (e.g. nats://127.0.0.1:4222)"
            )
        servers.append(url)
    if not servers:
        example = DEFAULT_NATS_SERVER
        raise NatsSettingsError(f"NATS_SERVER {text!r} names no server (e.g. {example})")
    return tuple(servers)


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


@dataclass(frozen=True, kw_only=True)
class NatsSettings:
    """Servers, at most one way to authenticate, and TLS, validated at construction.

    Examples::

        NatsSettings.from_env()                       # NATS_SERVER, NATS_AUTH_*, NATS_TLS_*
        NatsSettings(servers=("nats://a:4222", "nats://b:4222"))
        NatsSettings(username="frontend", password="...", tls_ca_cert=Path("ca.pem"))
    """

    servers: tuple[str, ...] = (DEFAULT_NATS_SERVER,)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkey_seed: str | None = field(default=None, repr=False)
    """An nkey seed (``SU...``), as Dynamo's ``NATS_AUTH_NKEY``."""
    credentials_file: Path | None = None
    tls_ca_cert: Path | None = None
    tls_client_cert: Path | None = None
    tls_client_key: Path | None = None

    def __post_init__(self) -> None:
        if not self.servers:
            raise NatsSettingsError("NATS_SERVER names no server")
        if (self.username is None) != (self.password is None):
            raise NatsSettingsError(
                "NATS_AUTH_USERNAME and NATS_AUTH_PASSWORD must be set together"
            )
        methods = [self.username, self.token, self.nkey_seed, self.credentials_file]
        if sum(method is not None for method in methods) > 1:
            raise NatsSettingsError(
                "set one of NATS_AUTH_USERNAME+NATS_AUTH_PASSWORD, NATS_AUTH_TOKEN, "
                "NATS_AUTH_NKEY or NATS_AUTH_CREDENTIALS_FILE, not several"
            )
        if (self.tls_client_cert is None) != (self.tls_client_key is None):
            raise NatsSettingsError(
                "NATS_TLS_CLIENT_CERT_PATH and NATS_TLS_CLIENT_KEY_PATH must be set together"
            )
        for variable, path in self._files().items():
            if not path.is_file():
                raise NatsSettingsError(f"{variable} names {str(path)!r}, which is not a file")

    @classmethod
    def from_env(
        cls, servers: str | None = None, env: Mapping[str, str] = os.environ
    ) -> NatsSettings:
        """Read ``NATS_*`` from ``env``; ``servers`` (a flag's value) wins over ``NATS_SERVER``."""

        def get(name: str) -> str | None:
            return env.get(name) or None

        def path(name: str) -> Path | None:
            value = get(name)
            return Path(value).expanduser() if value else None

        return cls(
            servers=parse_nats_servers(servers or get("NATS_SERVER") or DEFAULT_NATS_SERVER),
            username=get("NATS_AUTH_USERNAME"), password=get("NATS_AUTH_PASSWORD"),
            token=get("NATS_AUTH_TOKEN"), nkey_seed=get("NATS_AUTH_NKEY"),
            credentials_file=path("NATS_AUTH_CREDENTIALS_FILE"),
            tls_ca_cert=path("NATS_TLS_CA_CERT_PATH"),
            tls_client_cert=path("NATS_TLS_CLIENT_CERT_PATH"),
            tls_client_key=path("NATS_TLS_CLIENT_KEY_PATH"),
        )  # fmt: skip

    @property
    def servers_text(self) -> str:
        """The server list for messages and logs, without any ``user:password@``."""
        return ",".join(_without_userinfo(url) for url in self.servers)

    @property
    def auth_variables(self) -> str:
        """The variables that set how this process authenticates, for error messages."""
        if self.username is not None:
            return "NATS_AUTH_USERNAME and NATS_AUTH_PASSWORD"
        if self.token is not None:
            return "NATS_AUTH_TOKEN"
        if self.nkey_seed is not None:
            return "NATS_AUTH_NKEY"
        if self.credentials_file is not None:
            return "NATS_AUTH_CREDENTIALS_FILE"
        return "NATS_AUTH_* (none is set, and the server requires credentials)"

    @property
    def tls_variables(self) -> str:
        """The variables that set TLS, for error messages."""
        client = " and NATS_TLS_CLIENT_CERT_PATH/NATS_TLS_CLIENT_KEY_PATH"
        return "NATS_TLS_CA_CERT_PATH" + (client if self.tls_client_cert else "")

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments of ``nats.connect`` for the credentials and TLS."""
        options: dict[str, Any] = {}
        if self.username is not None:
            options.update(user=self.username, password=self.password)
        if self.token is not None:
            options["token"] = self.token
        if self.nkey_seed is not None:
            options["nkeys_seed_str"] = self.nkey_seed
        if self.credentials_file is not None:
            options["user_credentials"] = str(self.credentials_file)
        context = self.ssl_context()
        if context is not None:
            options["tls"] = context
        return options

    def ssl_context(self) -> ssl.SSLContext | None:
        """A TLS context trusting the CA (and presenting the client certificate), or None."""
        if self.tls_ca_cert is None and self.tls_client_cert is None:
            return None
        try:
            context = ssl.create_default_context(
                cafile=str(self.tls_ca_cert) if self.tls_ca_cert else None
            )
            if self.tls_client_cert is not None and self.tls_client_key is not None:
                context.load_cert_chain(str(self.tls_client_cert), str(self.tls_client_key))
        except (ssl.SSLError, OSError) as exc:
            raise NatsSettingsError(
                f"cannot load the NATS TLS files ({exc}); check {self.tls_variables}"
            ) from exc
        return context

    def _files(self) -> dict[str, Path]:
        files = {
            "NATS_AUTH_CREDENTIALS_FILE": self.credentials_file,
            "NATS_TLS_CA_CERT_PATH": self.tls_ca_cert,
            "NATS_TLS_CLIENT_CERT_PATH": self.tls_client_cert,
            "NATS_TLS_CLIENT_KEY_PATH": self.tls_client_key,
        }
        return {variable: path for variable, path in files.items() if path is not None}
