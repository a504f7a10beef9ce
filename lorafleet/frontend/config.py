"""The frontend's settings, each declared once: its command line, its variables, its
``--help``, its checks and the README's table all come from these fields.

``FrontendConfig`` adds the frontend's own settings to the ones every process shares
(``ConnectionSettings``), and holds ``DispatchSettings`` (``lorafleet/frontend/dispatcher.py``:
stall, attempts, migration) and ``AdmissionSettings`` (``lorafleet/frontend/admission.py``: the
fleet's slots, the wait), declared beside the code that reads them. Adding a setting is one
``setting(...)`` field on the class that uses it (``lorafleet/process/settings.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Final

from msgspec import Meta

from lorafleet.discovery.connection_settings import ConnectionSettings
from lorafleet.frontend.admission import AdmissionSettings
from lorafleet.frontend.dispatcher import DispatchSettings
from lorafleet.frontend.kv.prefix_index import DEFAULT_MAX_BLOCKS
from lorafleet.frontend.on_demand import DEFAULT_ON_DEMAND_QUEUE
from lorafleet.frontend.request_body import DEFAULT_BODY_TIMEOUT_S
from lorafleet.frontend.router import ROUTERS
from lorafleet.process.settings import AT_LEAST_ONE, PORT, POSITIVE, setting

PREFIX_ROUTERS: Final = ("prefix", "prefix-approx")
"""The prefix-aware modes (``frontend.kv``): by the workers' KV events, or only by where this
frontend sent each prefix."""
MAX_LOAD_WEIGHT: Final = 1000.0
DEFAULT_SLO_WINDOW_S: Final = 10.0
DEFAULT_SLO_MIN_REQUESTS: Final = 20

__all__ = ["FrontendConfig"]


@dataclass(frozen=True, kw_only=True)
class FrontendConfig(ConnectionSettings):
    """Where the frontend finds etcd and NATS, which namespace it serves, how it routes.

    Examples::

        FrontendConfig()                                            # local defaults
        FrontendConfig(namespace="prod", router="least-inflight")
        FrontendConfig(router="prefix", router_load_weight=0)     # cache only, ties by load
        FrontendConfig(etcd=EtcdSettings.from_env(), nats_server="nats://nats:4222")
        FrontendConfig(admin_token="s3cret", worker_token="w0rk3r", on_demand_timeout_s=120)
        FrontendConfig(on_demand_queue=1024)
        FrontendConfig(admission=AdmissionSettings(fleet_max_inflight=64))
        FrontendConfig(connect_timeout_s=300, shutdown_grace_s=30)
        FrontendConfig(slo_window_s=2, slo_min_requests=5)     # tests: SLOs judged fast
    """

    http_host: str = setting(
        "0.0.0.0", flag="--http-host", env="DYN_HTTP_HOST", help="the address to listen on"
    )
    http_port: Annotated[int, PORT] = setting(
        8000, flag="--http-port", env="DYN_HTTP_PORT", help="the frontend's HTTP port"
    )
    router: str = setting(
        "prefix", flag="--router", env="DYN_ROUTER_MODE",
        choices=(*ROUTERS, *PREFIX_ROUTERS),
        help="how requests pick an instance: prefix (base models and adapters: the longest "
        "cached prefix against load, from the workers' KV events; by where this frontend "
        "sent each prefix for engines without events), prefix-approx (by where it sent "
        "each prefix only), round-robin or least-inflight (base models; adapters go to the "
        "least busy instance that has them)",
        more="See [`docs/routing.md`](docs/routing.md).",
    )  # fmt: skip
    router_load_weight: Annotated[float, Meta(ge=0, le=MAX_LOAD_WEIGHT)] = setting(
        0.5, flag="--router-load-weight", env="DYN_ROUTER_LOAD_WEIGHT",
        help="prefix routers: what a token an instance is already working on costs, against "
        "one prompt token it would have to compute (0: cache only, ties by load)",
    )  # fmt: skip
    kv_index_max_blocks: Annotated[int, AT_LEAST_ONE] = setting(
        DEFAULT_MAX_BLOCKS, flag="--kv-index-max-blocks", env="DYN_KV_INDEX_MAX_BLOCKS",
        help="prefix router: KV blocks the index keeps at most across every instance "
        "(about 90 bytes each); past it new blocks are not indexed, and counted",
    )  # fmt: skip
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    on_demand_timeout_s: Annotated[float, POSITIVE] = setting(
        60.0, flag="--on-demand-timeout-s", env="DYN_ON_DEMAND_TIMEOUT_S",
        help="seconds a request for a cold adapter waits for its on-demand load",
    )  # fmt: skip
    on_demand_queue: Annotated[int, AT_LEAST_ONE] = setting(
        DEFAULT_ON_DEMAND_QUEUE, flag="--on-demand-queue", env="DYN_ON_DEMAND_QUEUE",
        help="requests that may wait for one adapter's on-demand load; the next get 429 "
        "capacity",
    )  # fmt: skip
    shutdown_grace_s: Annotated[float, POSITIVE] = setting(
        10.0, flag="--shutdown-grace", env="DYN_SHUTDOWN_GRACE",
        help="seconds requests still running after SIGTERM get before they are cancelled",
    )  # fmt: skip
    admin_token: str | None = setting(
        None, env="DYN_ADMIN_TOKEN", secret=True,
        help="when set, /v1/adapters writes and vLLM's LoRA routes need Authorization: Bearer "
        "<token>; unset, they are open and the frontend warns at start",
        more="`lorafleet lora apply/delete` send it.",
    )  # fmt: skip
    metrics_token: str | None = setting(
        None, env="DYN_METRICS_TOKEN", secret=True,
        help="when set, /metrics needs Authorization: Bearer <token>; unset, /metrics is "
        "open until the first tenant exists and refused (401) from then on",
        more="Its series name every tenant's models; see [`docs/tenants.md`](docs/tenants.md).",
    )  # fmt: skip
    worker_token: str | None = setting(
        None, env="DYN_SYSTEM_AUTH_TOKEN", secret=True,
        help="the workers' token, sent with the frontend's on-demand loads over NATS",
    )  # fmt: skip
    body_timeout_s: Annotated[float, POSITIVE] = setting(
        DEFAULT_BODY_TIMEOUT_S, flag="--body-timeout-s", env="DYN_BODY_TIMEOUT_S",
        help="seconds after a request's head by which its whole body must arrive; 408 after",
    )  # fmt: skip
    slo_window_s: Annotated[float, AT_LEAST_ONE] = setting(
        DEFAULT_SLO_WINDOW_S, flag="--slo-window-s", env="DYN_SLO_WINDOW_S",
        help="seconds per window over which adapters' latency targets are measured and "
        "judged; give every frontend the same",
        more="See [`docs/slo.md`](docs/slo.md).",
    )  # fmt: skip
    slo_min_requests: Annotated[int, AT_LEAST_ONE] = setting(
        DEFAULT_SLO_MIN_REQUESTS, flag="--slo-min-requests", env="DYN_SLO_MIN_REQUESTS",
        help="answered requests an adapter needs in a window (every frontend's) before a "
        "missed latency target adds a copy",
    )  # fmt: skip
