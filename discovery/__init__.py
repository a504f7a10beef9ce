"""The control-plane connections: etcd (lease, records, key layout, watch cache) and NATS."""

from lorafleet.discovery import _grpc_env  # noqa: F401  (first: before anything imports grpc)
from lorafleet.discovery.client import (
    ETCD_OP_TIMEOUT_S,
    MAX_RECONNECT_BACKOFF_MS,
    RERESOLVE_INTERVAL_S,
    EtcdClient,
    connect_etcd,
)
from lorafleet.discovery.connect import (
    wait_for_etcd,
    wait_for_nats,
)
from lorafleet.discovery.connection_flags import (
    ConnectionArgs,
    add_connection_flags,
    connection_args,
)
from lorafleet.discovery.errors import (
    EtcdRefusedError,
    EtcdUnavailableError,
    NatsAuthError,
    NatsConnectError,
    NatsSettingsError,
)
from lorafleet.discovery.keys import (
    ADAPTERS_ROOT,
    DEFAULT_NAMESPACE,
    INSTANCES_ROOT,
    KEYS_ROOT,
    LOAD_ROOT,
    MDC_ROOT,
    adapter_key,
    adapters_prefix,
    base_card_key,
    card_prefix,
    endpoint_path,
    instance_key,
    instance_prefix,
    load_key,
    load_prefix,
    lora_card_key,
    nats_subject,
    parse_card_key,
    parse_load_key,
)
from lorafleet.discovery.lease import (
    LeaseKeeper,
    LeaseState,
)
from lorafleet.discovery.nats_connection import (
    DEFAULT_INBOX_PREFIX,
    NATS_CONNECT_TIMEOUT_S,
    NATS_RECONNECT_CAP_S,
    WORKER_INBOX_PREFIX,
    LostCallback,
    NatsConnection,
    NatsState,
    StateListener,
)
from lorafleet.discovery.nats_settings import (
    DEFAULT_NATS_SERVER,
    NatsSettings,
    parse_nats_servers,
)
from lorafleet.discovery.settings import (
    DEFAULT_ETCD_ENDPOINTS,
    EtcdSettings,
    parse_endpoints,
)
from lorafleet.discovery.startup import (
    DEFAULT_CONNECT_TIMEOUT_S,
    ConnectTimeoutError,
    connect_with_retry,
    unless_stopped,
)
from lorafleet.discovery.watch_cache import (
    WatchCache,
    WatchListener,
)

__all__ = [
    "ADAPTERS_ROOT",
    "ConnectTimeoutError",
    "ConnectionArgs",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_ETCD_ENDPOINTS",
    "DEFAULT_INBOX_PREFIX",
    "DEFAULT_NAMESPACE",
    "DEFAULT_NATS_SERVER",
    "ETCD_OP_TIMEOUT_S",
    "EtcdClient",
    "EtcdRefusedError",
    "EtcdSettings",
    "EtcdUnavailableError",
    "INSTANCES_ROOT",
    "KEYS_ROOT",
    "LOAD_ROOT",
    "LeaseKeeper",
    "LeaseState",
    "LostCallback",
    "MAX_RECONNECT_BACKOFF_MS",
    "MDC_ROOT",
    "NATS_CONNECT_TIMEOUT_S",
    "NATS_RECONNECT_CAP_S",
    "NatsAuthError",
    "NatsConnectError",
    "NatsConnection",
    "NatsSettings",
    "NatsSettingsError",
    "NatsState",
    "RERESOLVE_INTERVAL_S",
    "StateListener",
    "WORKER_INBOX_PREFIX",
    "WatchCache",
    "WatchListener",
    "adapter_key",
    "adapters_prefix",
    "add_connection_flags",
    "base_card_key",
    "card_prefix",
    "connect_etcd",
    "connect_with_retry",
    "connection_args",
    "endpoint_path",
    "instance_key",
    "instance_prefix",
    "load_key",
    "load_prefix",
    "lora_card_key",
    "nats_subject",
    "parse_card_key",
    "parse_endpoints",
    "parse_load_key",
    "parse_nats_servers",
    "unless_stopped",
    "wait_for_etcd",
    "wait_for_nats",
]
