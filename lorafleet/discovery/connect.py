"""Start-up connections to NATS and etcd, each waited for up to the connect timeout.

The worker and the frontend both start by reaching NATS and etcd; these say once which
service is waited for, where, and which variable to check when it never answers
(``connect_with_retry`` does the waiting).
"""

from __future__ import annotations

from lorafleet.discovery.client import EtcdClient, connect_etcd
from lorafleet.discovery.nats_connection import DEFAULT_INBOX_PREFIX, LostCallback, NatsConnection
from lorafleet.discovery.nats_settings import NatsSettings
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.discovery.startup import connect_with_retry

__all__ = ["wait_for_etcd", "wait_for_nats"]


async def wait_for_nats(
    settings: NatsSettings,
    *,
    name: str,
    timeout_s: float,
    on_lost: LostCallback | None = None,
    inbox_prefix: str = DEFAULT_INBOX_PREFIX,
) -> NatsConnection:
    """Connect to NATS as ``name``; raises ``ConnectTimeoutError`` naming ``NATS_SERVER``."""
    return await connect_with_retry(
        lambda: NatsConnection.connect(
            settings, name=name, on_lost=on_lost, inbox_prefix=inbox_prefix
        ),
        service="NATS", url=settings.servers_text, timeout_s=timeout_s,
        check="NATS_SERVER (--nats-server)",
    )  # fmt: skip


async def wait_for_etcd(settings: EtcdSettings, *, timeout_s: float) -> EtcdClient:
    """Connect to etcd; raises ``ConnectTimeoutError`` naming ``ETCD_ENDPOINTS``."""
    return await connect_with_retry(
        lambda: connect_etcd(settings),
        service="etcd", url=settings.describe(), timeout_s=timeout_s,
        check="ETCD_ENDPOINTS (--etcd-endpoints)",
    )  # fmt: skip
