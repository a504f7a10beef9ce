"""The frontend's configuration, validated once; flags and environment fill it in ``__main__``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from lorafleet.discovery.keys import DEFAULT_NAMESPACE
from lorafleet.discovery.nats_settings import DEFAULT_NATS_SERVER
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.discovery.startup import DEFAULT_CONNECT_TIMEOUT_S
from lorafleet.frontend.dispatcher import DispatchSettings
from lorafleet.frontend.on_demand import DEFAULT_ON_DEMAND_QUEUE
from lorafleet.frontend.request_body import DEFAULT_BODY_TIMEOUT_S
from lorafleet.frontend.router import ROUTERS
from lorafleet.process.header_timeout import DEFAULT_HEADER_TIMEOUT_S

__all__ = [
    "DEFAULT_HTTP_PORT",
    "DEFAULT_ON_DEMAND_TIMEOUT_S",
    "DEFAULT_SHUTDOWN_GRACE_S",
    "FrontendConfig",
]

DEFAULT_HTTP_PORT: Final = 8000
DEFAULT_ON_DEMAND_TIMEOUT_S: Final = 60.0
DEFAULT_SHUTDOWN_GRACE_S: Final = 10.0


@dataclass(frozen=True, kw_only=True)
class FrontendConfig:
    """Where the frontend finds etcd and NATS, which namespace it serves, how it routes.

    Examples::

        FrontendConfig()                                            # local defaults
        FrontendConfig(namespace="prod", router="least-inflight")
        FrontendConfig(etcd=EtcdSettings.from_env(), nats_server="nats://nats:4222")
        FrontendConfig(admin_token="s3cret", worker_token="w0rk3r", on_demand_timeout_s=120)
        FrontendConfig(on_demand_queue=1024)
        FrontendConfig(connect_timeout_s=300, shutdown_grace_s=30)
    """

    namespace: str = DEFAULT_NAMESPACE
    etcd: EtcdSettings = field(default_factory=EtcdSettings)
    """``ETCD_ENDPOINTS`` and the ``ETCD_AUTH_*`` credentials and TLS files."""
    nats_server: str = DEFAULT_NATS_SERVER
    router: str = "round-robin"
    http_host: str = "0.0.0.0"
    http_port: int = DEFAULT_HTTP_PORT
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)
    on_demand_timeout_s: float = DEFAULT_ON_DEMAND_TIMEOUT_S
    """How long a request for a cold adapter waits for its on-demand load."""
    on_demand_queue: int = DEFAULT_ON_DEMAND_QUEUE
    """How many requests may wait for one adapter's on-demand load; 429 beyond."""
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    """How long start-up waits for each of NATS and etcd before the process exits 1."""
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    """On SIGTERM, requests still running after this long are cancelled."""
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    """Connections that send no complete request head within this long are closed."""
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    """A request whose body has not all arrived this long after its head is answered 408."""
    admin_token: str | None = field(default=None, repr=False)
    """Bearer token the mutating ``/v1/adapters`` routes require (``DYN_ADMIN_TOKEN``)."""
    worker_token: str | None = field(default=None, repr=False)
    """The workers' ``DYN_SYSTEM_AUTH_TOKEN``, sent with on-demand loads over NATS."""

    def __post_init__(self) -> None:
        if not self.namespace or "/" in self.namespace or "." in self.namespace:
            raise ValueError(f"namespace {self.namespace!r} must be non-empty, without '/' or '.'")
        if self.router not in ROUTERS:
            raise ValueError(f"unknown router {self.router!r}; choose one of {', '.join(ROUTERS)}")
        if not 0 <= self.http_port <= 65535:
            raise ValueError(f"http_port {self.http_port} is not a TCP port")
        if self.on_demand_queue < 1:
            raise ValueError(f"on_demand_queue must be at least 1, got {self.on_demand_queue}")
        for name in ("on_demand_timeout_s", "connect_timeout_s", "shutdown_grace_s",
                     "header_timeout_s", "body_timeout_s"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
