"""How to reach etcd: endpoints, credentials and TLS files, read once from the environment.

Every process that connects (worker, frontend, ``lorafleet`` CLI, benchmarks) builds one
``EtcdSettings`` at start and hands it to ``connect_etcd``; nothing else reads these
variables. The names are NVIDIA Dynamo's, so operators can move between the two.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

__all__ = ["DEFAULT_ETCD_ENDPOINTS", "EtcdSettings", "parse_endpoints"]

DEFAULT_ETCD_ENDPOINTS: Final = "http://127.0.0.1:2379"
_DEFAULT_PORT: Final = 2379
_SCHEMES: Final = ("http", "https")


def parse_endpoints(endpoints: str) -> tuple[str, ...]:
    """Split comma-separated ``ETCD_ENDPOINTS`` into normalised ``scheme://host:port`` URLs.

    A URL without a scheme is ``http://``; one without a port gets 2379.
    """
    urls = []
    for raw in endpoints.split(","):
        text = raw.strip()
        if not text:
            continue
        parsed = urlsplit(text if "://" in text else f"http://{text}")
        if parsed.scheme not in _SCHEMES or not parsed.hostname:
            raise ValueError(
                f"ETCD_ENDPOINTS entry {text!r} is not an http:// or https:// URL with a host "
                "(e.g. http://127.0.0.1:2379)"
            )
        host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
        urls.append(f"{parsed.scheme}://{host}:{parsed.port or _DEFAULT_PORT}")
    if not urls:
        raise ValueError(f"ETCD_ENDPOINTS {endpoints!r} names no endpoint")
    return tuple(urls)


@dataclass(frozen=True, kw_only=True)
class EtcdSettings:
    """Endpoints, user and TLS files for etcd, validated once at construction.

    Examples::

        EtcdSettings()                                             # one local etcd, no auth
        EtcdSettings(endpoints=parse_endpoints("http://a:2379,http://b:2379"))
        EtcdSettings.from_env(os.environ)                          # ETCD_* variables
    """

    endpoints: tuple[str, ...] = (DEFAULT_ETCD_ENDPOINTS,)
    username: str | None = None
    """``ETCD_AUTH_USERNAME``: with a password, every call carries this user's token."""
    password: str | None = field(default=None, repr=False)
    """``ETCD_AUTH_PASSWORD``; never logged."""
    ca_path: Path | None = None
    """``ETCD_AUTH_CA``: the CA that signed the servers' certificates (else the system's)."""
    client_cert_path: Path | None = None
    """``ETCD_AUTH_CLIENT_CERT``: the client certificate for mutual TLS."""
    client_key_path: Path | None = None
    """``ETCD_AUTH_CLIENT_KEY``: its private key."""

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("ETCD_ENDPOINTS names no endpoint")
        schemes = {url.split("://", 1)[0] for url in self.endpoints}
        if len(schemes) > 1:
            raise ValueError(f"ETCD_ENDPOINTS mixes http:// and https://: {self.describe()}")
        if (self.username is None) != (self.password is None):
            raise ValueError("set both ETCD_AUTH_USERNAME and ETCD_AUTH_PASSWORD, or neither")
        if (self.client_cert_path is None) != (self.client_key_path is None):
            raise ValueError("set both ETCD_AUTH_CLIENT_CERT and ETCD_AUTH_CLIENT_KEY, or neither")
        self._check_tls_files()

    def _check_tls_files(self) -> None:
        files = {
            "ETCD_AUTH_CA": self.ca_path,
            "ETCD_AUTH_CLIENT_CERT": self.client_cert_path,
            "ETCD_AUTH_CLIENT_KEY": self.client_key_path,
        }
        for variable, path in files.items():
            if path is None:
                continue
            if not self.tls:
                raise ValueError(f"{variable} is set but ETCD_ENDPOINTS are not https://")
            if not path.is_file():
                raise ValueError(f"{variable} {str(path)!r} is not a readable file")

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] = os.environ, *, endpoints: str | None = None
    ) -> EtcdSettings:
        """Read the ``ETCD_*`` variables; ``endpoints`` (a flag) wins over ``ETCD_ENDPOINTS``."""

        def path(name: str) -> Path | None:
            value = env.get(name, "").strip()
            return Path(value) if value else None

        return cls(
            endpoints=parse_endpoints(
                endpoints or env.get("ETCD_ENDPOINTS", DEFAULT_ETCD_ENDPOINTS)
            ),
            username=env.get("ETCD_AUTH_USERNAME") or None,
            password=env.get("ETCD_AUTH_PASSWORD") or None,
            ca_path=path("ETCD_AUTH_CA"),
            client_cert_path=path("ETCD_AUTH_CLIENT_CERT"),
            client_key_path=path("ETCD_AUTH_CLIENT_KEY"),
        )

    @classmethod
    def from_endpoints(cls, endpoints: str) -> EtcdSettings:
        """Settings for comma-separated endpoint URLs, without credentials or TLS files."""
        return cls(endpoints=parse_endpoints(endpoints))

    @property
    def tls(self) -> bool:
        """Whether the endpoints are ``https://``."""
        return self.endpoints[0].startswith("https://")

    @property
    def host_ports(self) -> tuple[tuple[str, int], ...]:
        """Each endpoint's host (without IPv6 brackets) and port."""
        pairs = []
        for url in self.endpoints:
            parsed = urlsplit(url)
            pairs.append((parsed.hostname or "", parsed.port or _DEFAULT_PORT))
        return tuple(pairs)

    def describe(self) -> str:
        """The endpoints as one string for error messages (no credentials in it)."""
        return ",".join(self.endpoints)

    def env(self) -> dict[str, str]:
        """The ``ETCD_*`` variables that recreate these settings in a child process."""
        values = {
            "ETCD_ENDPOINTS": self.describe(),
            "ETCD_AUTH_USERNAME": self.username,
            "ETCD_AUTH_PASSWORD": self.password,
            "ETCD_AUTH_CA": self.ca_path and str(self.ca_path),
            "ETCD_AUTH_CLIENT_CERT": self.client_cert_path and str(self.client_cert_path),
            "ETCD_AUTH_CLIENT_KEY": self.client_key_path and str(self.client_key_path),
        }
        return {name: value for name, value in values.items() if value}
