"""The control-plane connections: etcd (lease, records, key layout, watch cache) and NATS."""

from discovery.client import (
    ETCD_OP_TIMEOUT_S,
    EtcdClient,
    connect_etcd,
    parse_endpoint,
)
from discovery.errors import (
    EtcdUnavailableError,
    NatsAuthError,
    NatsConnectError,
    NatsSettingsError,
)
from discovery.keys import (
    ADAPTERS_ROOT,
    INSTANCES_ROOT,
    MDC_ROOT,
    adapter_key,
    adapters_prefix,
    base_card_key,
    card_prefix,
    instance_key,
    instance_prefix,
    lora_card_key,
    nats_subject,
    parse_card_key,
)
from discovery.lease import (
    LeaseKeeper,
    LeaseState,
)
from discovery.logs import (
    configure_logging,
)
from discovery.nats_connection import (
    DEFAULT_INBOX_PREFIX,
    NATS_CONNECT_TIMEOUT_S,
    NATS_RECONNECT_CAP_S,
    WORKER_INBOX_PREFIX,
    LostCallback,
    NatsConnection,
    NatsState,
    StateListener,
)
from discovery.nats_settings import (
    DEFAULT_NATS_SERVER,
    NatsSettings,
    parse_nats_servers,
)
from discovery.watch_cache import (
    WatchCache,
    WatchListener,
)

__all__ = [
    "ADAPTERS_ROOT",
    "DEFAULT_INBOX_PREFIX",
    "DEFAULT_NATS_SERVER",
    "ETCD_OP_TIMEOUT_S",
    "EtcdClient",
    "EtcdUnavailableError",
    "INSTANCES_ROOT",
    "LeaseKeeper",
    "LeaseState",
    "LostCallback",
    "MDC_ROOT",
    "NATS_CONNECT_TIMEOUT_S",
    "NATS_RECONNECT_CAP_S",
    "NatsAuthError",
    "NatsConnectError",
    "NatsConnection",
    "NatsSettings",
    "NatsSettingsError",
    "NatsState",
    "StateListener",
    "WORKER_INBOX_PREFIX",
    "WatchCache",
    "WatchListener",
    "adapter_key",
    "adapters_prefix",
    "base_card_key",
    "card_prefix",
    "configure_logging",
    "connect_etcd",
    "instance_key",
    "instance_prefix",
    "lora_card_key",
    "nats_subject",
    "parse_card_key",
    "parse_endpoint",
    "parse_nats_servers",
]
