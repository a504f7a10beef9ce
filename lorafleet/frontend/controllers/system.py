"""``/health`` and ``/metrics``: what load balancers and Prometheus ask."""

from __future__ import annotations

from litestar import Controller, Response, get
from litestar.di import NamedDependency

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
        media_type=METRICS_CONTENT_TYPE,
    )
    async def metrics(self, services: NamedDependency[Services]) -> bytes:
        """Requests, errors, latency and time to first token per model."""
        return services.metrics.render()
