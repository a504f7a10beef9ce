"""The settings every process that joins a fleet shares: its namespace, where etcd and NATS
are, and how long start-up and a request head may take. The worker's and the frontend's
configs derive from ``ConnectionSettings``, so these are declared once for both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from msgspec import Meta

from lorafleet.discovery.keys import DEFAULT_NAMESPACE
from lorafleet.discovery.nats_settings import DEFAULT_NATS_SERVER
from lorafleet.discovery.settings import DEFAULT_ETCD_ENDPOINTS, EtcdSettings
from lorafleet.discovery.startup import DEFAULT_CONNECT_TIMEOUT_S
from lorafleet.process.header_timeout import DEFAULT_HEADER_TIMEOUT_S
from lorafleet.process.settings import POSITIVE, Settings, setting

__all__ = ["ConnectionSettings"]

_NAMESPACE = Meta(pattern=r"^[^/.]+$", description="non-empty, without '/' or '.'")
"""A namespace is a part of etcd keys and NATS subjects."""


def _etcd_from_env(endpoints: str) -> EtcdSettings:
    """``ETCD_AUTH_*`` and the TLS files come from the environment only (they are secrets)."""
    return EtcdSettings.from_env(endpoints=endpoints)


@dataclass(frozen=True, kw_only=True)
class ConnectionSettings(Settings):
    """Namespace, etcd, NATS and the start-up and request-head timeouts.

    Examples::

        ConnectionSettings()                                     # local etcd and NATS
        ConnectionSettings(namespace="prod", nats_server="nats://nats:4222")
    """

    namespace: Annotated[str, _NAMESPACE] = setting(
        DEFAULT_NAMESPACE, flag="--namespace", env="DYN_NAMESPACE",
        help="the etcd and NATS namespace; a frontend serves only its namespace's workers",
    )  # fmt: skip
    etcd: EtcdSettings = setting(
        factory=EtcdSettings, flag="--etcd-endpoints", env="ETCD_ENDPOINTS",
        parse=_etcd_from_env, shown=DEFAULT_ETCD_ENDPOINTS,
        help="comma-separated etcd member URLs, all http:// or all https://",
        more="The client fails over between them; `ETCD_AUTH_*` below add credentials "
        "([`docs/etcd.md`](docs/etcd.md)).",
    )  # fmt: skip
    nats_server: str = setting(
        DEFAULT_NATS_SERVER, flag="--nats-server", env="NATS_SERVER",
        help="comma-separated nats:// or tls:// URLs (host:port gets nats://)",
        more="The client fails over between them and learns the cluster's other members from "
        "the servers ([`docs/nats.md`](docs/nats.md)).",
    )  # fmt: skip
    connect_timeout_s: Annotated[float, POSITIVE] = setting(
        DEFAULT_CONNECT_TIMEOUT_S, flag="--connect-timeout-s", env="DYN_CONNECT_TIMEOUT_S",
        help="seconds start-up waits for each of NATS and etcd, then exits 1",
        more="One log line per change of reason while it waits.",
    )  # fmt: skip
    header_timeout_s: Annotated[float, POSITIVE] = setting(
        DEFAULT_HEADER_TIMEOUT_S, flag="--header-timeout-s", env="DYN_HEADER_TIMEOUT_S",
        help="seconds a connection may take to send a complete request head before it is closed",
        more="The frontend's port and the worker's status port.",
    )  # fmt: skip
