"""``/health`` and ``/metrics``: what load balancers and Prometheus ask (``/metrics`` with
its own token once tenants exist: ``frontend.fleet_reads``)."""

from __future__ import annotations

from litestar import Controller, Response, get
from litestar.di import NamedDependency

from lorafleet.frontend.controllers._responses import error_answer
from lorafleet.frontend.fleet_reads import require_metrics_token
from lorafleet.frontend.metrics import METRICS_CONTENT_TYPE
from lorafleet.frontend.services import Services
from lorafleet.proto.openai import FrontendHealth

__all__ = ["SystemController"]


class SystemController(Controller):
    """Health and metrics of this frontend process."""

    path = "/"
    tags = ["system"]

    @get("/health", operation_id="health", summary="Liveness and readiness", cache=False)
    async def health(self, services: NamedDependency[Services]) -> Response[FrontendHealth]:
        """200 while NATS is connected, 503 otherwise; counts what etcd shows. ``degraded``
        (still 200) while etcd is cut off: requests are routed by the last view of it."""
        connected = services.plane.nc.is_connected
        in_sync = services.registry.etcd_in_sync
        body = FrontendHealth(
            status="unhealthy" if not connected else "healthy" if in_sync else "degraded",
            nats="connected" if connected else "disconnected",
            etcd="in sync" if in_sync else "cut off: serving the last view",
            models=len(services.registry.names()),
            instances=services.registry.instance_count,
            unreachable=services.unreachable.reasons(),
        )
        return Response(body, status_code=200 if connected else 503)

    @get(
        "/metrics",
        operation_id="metrics",
        summary="Prometheus metrics",
        description="Needs DYN_METRICS_TOKEN when set; unset, only until a tenant exists.",
        media_type=METRICS_CONTENT_TYPE,
        guards=[require_metrics_token],
        responses={401: error_answer("The metrics token is missing or wrong")},
    )
    async def metrics(self, services: NamedDependency[Services]) -> bytes:
        """Requests, errors, latency and time to first token per model."""
        return services.metrics.render()
