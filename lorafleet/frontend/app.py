"""Build the frontend's Litestar app: lifespan, dependencies, controllers, OpenAI errors.

The lifespan connects NATS and etcd, starts the watch caches (instances, cards,
desired adapters, load records), the request plane, the router, the on-demand loader and
the judging of rollouts and latency targets, and
puts them in one ``Services`` on ``app.state.services``; handlers receive it as the
``services`` dependency. Every
error leaves in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
from collections.abc import AsyncIterator
from typing import Any, Final

import structlog
from litestar import Litestar, Request, Response
from litestar.di import Provide
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin, YamlRenderPlugin

from lorafleet.discovery.connect import wait_for_etcd, wait_for_nats
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.discovery.nats_settings import NatsSettings
from lorafleet.discovery.startup import unless_stopped
from lorafleet.frontend.access_log import AccessLogMiddleware
from lorafleet.frontend.adapter_states import AdapterStates
from lorafleet.frontend.admission import FleetAdmission
from lorafleet.frontend.alias_checks import AliasChecks
from lorafleet.frontend.aliases import AliasBook
from lorafleet.frontend.config import PREFIX_ROUTERS, FrontendConfig
from lorafleet.frontend.controllers import CONTROLLERS
from lorafleet.frontend.desired_state import DesiredState
from lorafleet.frontend.dispatcher import Dispatcher
from lorafleet.frontend.errors import RETRY_AFTER_S, openai_error, openai_type, unexpected_error
from lorafleet.frontend.fleet_loads import FleetLoads
from lorafleet.frontend.generate_door import GenerateDoor
from lorafleet.frontend.generate_routes import ENDPOINT_BY_PATH
from lorafleet.frontend.generation import GenerationService
from lorafleet.frontend.json_request import BoundedJsonRequest
from lorafleet.frontend.kv.prefix_routing import start_prefix_router
from lorafleet.frontend.load_failures import LoadFailures
from lorafleet.frontend.lora_writes import LoraWrites
from lorafleet.frontend.metrics import FrontendMetrics
from lorafleet.frontend.on_demand import OnDemandLoader
from lorafleet.frontend.reachability import Unreachable
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.frontend.request_body import MAX_BODY_BYTES, describe_problem, leaves_body_unread
from lorafleet.frontend.request_plane import RequestPlane
from lorafleet.frontend.resolver import ModelResolver
from lorafleet.frontend.rollout_loop import RolloutLoop
from lorafleet.frontend.router import Router, make_router
from lorafleet.frontend.services import Services, services_of
from lorafleet.frontend.slo_loop import SloLoop
from lorafleet.frontend.slo_meter import SloMeter
from lorafleet.frontend.tenants import TenantGate
from lorafleet.proto.errors import LorafleetError, error_code
from lorafleet.proto.openai import OpenAIError, OpenAIErrorResponse

__all__ = ["create_app"]

log = structlog.get_logger(__name__)

FRONTEND_LEASE_TTL_S: Final = 10
"""This frontend's lease: its rollout and latency window reports and its presence record
(``frontend.tenants``). A frontend that dies still counts this long in the others' shares
of tenants' limits, so they enforce less than their share meanwhile."""


@contextlib.asynccontextmanager
async def _lifespan(app: Litestar) -> AsyncIterator[None]:
    """Connect everything the handlers need, and close it all in reverse on the way out."""
    config: FrontendConfig = app.state.config
    async with contextlib.AsyncExitStack() as stack:
        try:
            started = await unless_stopped(_start_services(app, config, stack), app.state.stopping)
        except LorafleetError as exc:
            log.error("frontend cannot start", error=exc.message)
            app.state.startup_error = exc.message  # says it all: __main__ drops the traceback
            raise
        if started is None:  # uvicorn, told to exit, binds and shuts down straight away
            log.info("frontend stopped during start-up")
        else:
            log.info("frontend ready", namespace=config.namespace, router=config.router,
                     models=len(services_of(app.state).registry.names()))  # fmt: skip
            # What start-up built (modules, the app, every card's entries) lives as long as
            # the process: a full collection would walk it all (50-70 ms at 10,000 cards)
            # while watch events and requests wait. Frozen, collections skip it.
            gc.freeze()
        yield
        log.info("frontend stopping", namespace=config.namespace)


async def _start_services(
    app: Litestar, config: FrontendConfig, stack: contextlib.AsyncExitStack
) -> bool:
    """Connect NATS and etcd, start the registry and the request plane (then True); undo
    everything via ``stack``."""
    settings = NatsSettings.from_env(config.nats_server)
    nats = await wait_for_nats(
        settings, timeout_s=config.connect_timeout_s, name=f"frontend-{os.getpid()}",
        on_lost=lambda: _nats_lost(app),
    )  # fmt: skip
    stack.push_async_callback(nats.aclose)
    plane = await RequestPlane.start(nats)
    stack.push_async_callback(plane.aclose)
    etcd = await wait_for_etcd(config.etcd, timeout_s=config.connect_timeout_s)
    stack.push_async_callback(etcd.close)
    registry = await ModelRegistry.start(etcd, config.namespace)
    stack.push_async_callback(registry.aclose)
    desired = await DesiredState.start(etcd, config.namespace)
    stack.push_async_callback(desired.aclose)
    loads = await FleetLoads.start(etcd, config.namespace)
    stack.push_async_callback(loads.aclose)
    metrics: FrontendMetrics = app.state.metrics
    metrics.follow_etcd(lambda: registry.etcd_in_sync)
    unreachable = Unreachable(plane, config.dispatch)
    stack.push_async_callback(unreachable.aclose)
    metrics.follow_unreachable(unreachable.count)
    if config.router in PREFIX_ROUTERS:
        router: Router = await start_prefix_router(
            config.router, stack, connection=nats, plane=plane, registry=registry,
            namespace=config.namespace, metrics=metrics.routing,
            load_weight=config.router_load_weight, max_blocks=config.kv_index_max_blocks,
        )  # fmt: skip
    else:
        router = make_router(config.router)
    dispatcher = Dispatcher(plane, router, config.dispatch, metrics, unreachable)
    failures = LoadFailures(loads)
    loader = OnDemandLoader(
        registry, plane, metrics, loads=loads, failures=failures,
        timeout_s=config.on_demand_timeout_s, queue_limit=config.on_demand_queue,
        settings=config.dispatch, worker_token=config.worker_token,
    )  # fmt: skip
    stack.push_async_callback(loader.aclose)
    resolver = ModelResolver(registry, desired, loader, loads)
    writes = LoraWrites(
        registry, desired, loads, loader, plane, timeout_s=config.on_demand_timeout_s,
        settings=config.dispatch, worker_token=config.worker_token,
    )  # fmt: skip
    aliases = await AliasBook.start(etcd, config.namespace)
    stack.push_async_callback(aliases.aclose)
    lease = await LeaseKeeper.grant(etcd, FRONTEND_LEASE_TTL_S)
    stack.push_async_callback(lease.aclose)  # one revoke: a hung etcd costs one time-out
    rollouts = await RolloutLoop.start(etcd, aliases, lease, metrics)
    stack.push_async_callback(rollouts.aclose)
    tenants = await TenantGate.start(etcd, config.namespace, lease, metrics)
    stack.push_async_callback(tenants.aclose)
    meter = SloMeter(desired, window_s=config.slo_window_s)
    slo = await SloLoop.start(etcd, meter, lease, registry=registry, desired=desired,
                              metrics=metrics, min_requests=config.slo_min_requests)  # fmt: skip
    stack.push_async_callback(slo.aclose)
    app.state.services = Services(
        plane=plane, registry=registry, desired=desired, loads=loads,
        adapters=AdapterStates(registry, desired, loads, failures, loader, slo.attainment),
        resolver=resolver, metrics=metrics,
        generation=GenerationService(resolver, dispatcher, metrics, rollouts, meter),
        aliases=aliases, alias_checks=AliasChecks(registry, desired, aliases), writes=writes,
        tenants=tenants, admission=FleetAdmission(config.admission, lambda: tenants.share),
        unreachable=unreachable,
    )  # fmt: skip
    if not config.admin_token:
        log.warning("DYN_ADMIN_TOKEN is not set: anyone can change the desired adapters")
    return True


def _nats_lost(app: Litestar) -> None:
    """The NATS connection closed for good: stop serving and exit 1 (``__main__`` reads it)."""
    app.state.fatal_error = "the NATS connection closed and cannot be re-made"
    os.kill(os.getpid(), signal.SIGTERM)


def _on_lorafleet_error(request: Request[Any, Any, Any], exc: LorafleetError) -> Response[Any]:
    status, body = openai_error(exc)
    headers = {"connection": "close"} if leaves_body_unread(exc) else {}
    if status == 429:
        headers["retry-after"] = str(RETRY_AFTER_S)
    return Response(body, status_code=status, headers=headers)


def _on_http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """Litestar's own errors (validation, unknown route, bad method) in OpenAI's shape."""
    status = exc.status_code
    code = error_code(status)
    message, param = _describe(exc)
    endpoint = ENDPOINT_BY_PATH.get(request.url.path.rstrip("/"))
    if endpoint is not None:
        request.app.state.metrics.rejected(endpoint, status, code)
    error = OpenAIError(message=message, type=openai_type(status), param=param, code=code)
    return Response(OpenAIErrorResponse(error=error), status_code=status, headers=exc.headers)


def _describe(exc: HTTPException) -> tuple[str, str | None]:
    """A message that names the problem, and the field it is about when one is."""
    if isinstance(exc, ValidationException) and isinstance(exc.extra, list) and exc.extra:
        first = exc.extra[0]
        if isinstance(first, dict) and "message" in first:
            key, problem = str(first.get("key") or "data"), str(first["message"])
            if key == "data" and problem == "'data'":  # litestar's wording for an absent body
                return "Invalid request body: the body is empty; send a JSON object", None
            return describe_problem("" if key == "data" else key, problem)
    detail = exc.detail or "request failed"
    if exc.status_code == 413:
        return f"Request body too large: the frontend reads at most {MAX_BODY_BYTES} bytes", None
    if exc.status_code == 405:
        return f"{detail}; allowed: {(exc.headers or {}).get('allow', 'none')}", None
    return detail, None


def _on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    status, body = unexpected_error(exc, request.url.path)
    return Response(body, status_code=status)


def create_app(config: FrontendConfig, *, metrics: FrontendMetrics | None = None) -> Litestar:
    """The frontend app; nothing connects until its lifespan starts."""
    app = Litestar(
        route_handlers=list(CONTROLLERS),
        lifespan=[_lifespan],
        middleware=[AccessLogMiddleware],
        request_class=BoundedJsonRequest,
        request_max_body_size=MAX_BODY_BYTES,
        dependencies={"services": Provide(services_of, sync_to_thread=False)},
        exception_handlers={
            LorafleetError: _on_lorafleet_error,
            HTTPException: _on_http_error,
            Exception: _on_unexpected,
        },
        openapi_config=OpenAPIConfig(
            title="lorafleet frontend",
            version="1",
            description="OpenAI-compatible API over a fleet of LoRA-serving workers.",
            path="/",
            # /docs is Swagger UI; its page loads the UI's assets from a CDN.
            render_plugins=[
                SwaggerRenderPlugin(path="/docs"),
                JsonRenderPlugin(),
                YamlRenderPlugin(),
            ],
        ),
        logging_config=None,
    )
    app.state.config = config
    app.state.stopping = asyncio.Event()  # set on SIGTERM/SIGINT: ends a waiting start-up
    app.state.metrics = metrics or FrontendMetrics()
    # In front of Litestar's own handler, as its CORS middleware would be (docs/frontend.md).
    app.asgi_handler = GenerateDoor(
        app.asgi_handler, app.state, body_timeout_s=config.body_timeout_s
    )
    return app
