"""The etcd side: connection, lease, records bound to it, key layout and a watch cache."""

from discovery.client import (
    ETCD_OP_TIMEOUT_S,
    EtcdClient,
    connect_etcd,
    parse_endpoint,
)
from discovery.errors import (
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
    "DEFAULT_HEADER_TIMEOUT_S",
    "ETCD_OP_TIMEOUT_S",
    "EtcdClient",
    "EtcdUnavailableError",
    "HeaderTimeoutProtocol",
    "INSTANCES_ROOT",
    "LeaseKeeper",
    "LeaseState",
    "MDC_ROOT",
    "WatchCache",
    "WatchListener",
    "adapter_key",
    "adapters_prefix",
    "base_card_key",
    "card_prefix",
    "configure_logging",
    "connect_etcd",
    "connect_with_retry",
    "instance_key",
    "instance_prefix",
    "lora_card_key",
    "nats_subject",
    "parse_card_key",
    "parse_endpoint",
    "unless_stopped",
    "with_header_timeout",
]
