"""The etcd side: connection, lease, records bound to it, key layout and a watch cache."""

from discovery import _grpc_env  # noqa: F401  (first: before anything imports grpc)
from discovery.cli_help import (
    HelpFormatter,
    add_version,
    lorafleet_version,
)
from discovery.client import (
    ETCD_OP_TIMEOUT_S,
    MAX_RECONNECT_BACKOFF_MS,
    RERESOLVE_INTERVAL_S,
    EtcdClient,
    connect_etcd,
)
from discovery.errors import (
    EtcdRefusedError,
    EtcdUnavailableError,
)
from discovery.header_timeout import (
    DEFAULT_HEADER_TIMEOUT_S,
    HeaderTimeoutProtocol,
    with_header_timeout,
)
from discovery.keys import (
    ADAPTERS_ROOT,
    INSTANCES_ROOT,
    KEYS_ROOT,
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
from discovery.settings import (
    DEFAULT_ETCD_ENDPOINTS,
    EtcdSettings,
    parse_endpoints,
)
from discovery.startup import (
    DEFAULT_CONNECT_TIMEOUT_S,
    ConnectTimeoutError,
    connect_with_retry,
    unless_stopped,
)
from discovery.watch_cache import (
    WatchCache,
    WatchListener,
)

__all__ = [
    "ADAPTERS_ROOT",
    "ConnectTimeoutError",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_ETCD_ENDPOINTS",
    "DEFAULT_HEADER_TIMEOUT_S",
    "ETCD_OP_TIMEOUT_S",
    "EtcdClient",
    "EtcdRefusedError",
    "EtcdSettings",
    "EtcdUnavailableError",
    "HeaderTimeoutProtocol",
    "HelpFormatter",
    "INSTANCES_ROOT",
    "KEYS_ROOT",
    "LeaseKeeper",
    "LeaseState",
    "MAX_RECONNECT_BACKOFF_MS",
    "MDC_ROOT",
    "RERESOLVE_INTERVAL_S",
    "WatchCache",
    "WatchListener",
    "adapter_key",
    "adapters_prefix",
    "add_version",
    "base_card_key",
    "card_prefix",
    "configure_logging",
    "connect_etcd",
    "connect_with_retry",
    "instance_key",
    "instance_prefix",
    "lora_card_key",
    "lorafleet_version",
    "nats_subject",
    "parse_card_key",
    "parse_endpoints",
    "unless_stopped",
    "with_header_timeout",
]
