"""Who may read the fleet's state, and what of it: ``/v1/adapters`` and ``/v1/aliases`` by
API key or admin token, ``/metrics`` by its own token.

Once tenants exist, the generate routes answer a name outside a key's patterns as one
that does not exist (404, not 403: docs/tenants.md); the reads must not undo that. So
the admin token sees every name, a key sees only its tenant's (others are 404 too), and
a caller with neither is refused (401). Without ``DYN_ADMIN_TOKEN`` the writes are open,
and so are these reads to a caller that sends no key. ``/metrics`` labels series by
model, so once tenants exist it answers only ``DYN_METRICS_TOKEN`` (Prometheus's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide
from litestar.handlers import BaseRouteHandler

from lorafleet.frontend.config import FrontendConfig
from lorafleet.frontend.services import Services, services_of
from lorafleet.process.auth import bearer_token_accepted
from lorafleet.proto.aliases import Alias
from lorafleet.proto.errors import UnauthorizedError
from lorafleet.proto.tenants import Tenant, may_use

__all__ = ["EVERY_NAME", "FleetView", "READ", "fleet_view", "require_metrics_token"]


class FleetView:
    """What one caller may see of the fleet's names: every name, or its tenant's."""

    __slots__ = ("tenant",)

    def __init__(self, tenant: Tenant | None) -> None:
        self.tenant = tenant
        """The tenant whose ``models`` patterns bound the view; None: every name."""

    def shows(self, name: str) -> bool:
        """Whether the caller may see ``name`` (an adapter's, an alias's)."""
        return self.tenant is None or may_use(self.tenant, name)

    def shown(self, names: Iterable[str]) -> list[str]:
        """The ``names`` the caller may see."""
        return [name for name in names if self.shows(name)]

    def shows_alias(self, alias: Alias) -> bool:
        """Whether the caller may see ``alias``: its name and every version it names (its
        record lists them)."""
        named = [alias.name, *(target.model for target in alias.targets)]
        if alias.rollout is not None:
            named += [alias.rollout.baseline, alias.rollout.canary]
        return all(map(self.shows, named))


EVERY_NAME: Final = FleetView(None)
"""The operator's view (and every caller's while no tenant exists)."""


def fleet_view(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> FleetView:
    """The ``view`` dependency of the fleet's read routes; raises ``UnauthorizedError`` (401)
    once tenants exist for a caller with neither the admin token nor an API key."""
    gate = services.tenants
    config: FrontendConfig = request.app.state.config
    authorization = request.headers.get("authorization")
    if not gate.keyed:
        return EVERY_NAME  # no tenants: nothing to keep apart
    if config.admin_token and bearer_token_accepted(authorization, config.admin_token):
        return EVERY_NAME
    if not config.admin_token and authorization is None:
        return EVERY_NAME  # as open as the writes
    try:
        return FleetView(gate.identify(authorization))
    except UnauthorizedError:
        raise UnauthorizedError(
            "reading the fleet's adapters and aliases needs 'Authorization: Bearer <token>': "
            "the frontend's DYN_ADMIN_TOKEN (every name) or an API key (its tenant's names)"
        ) from None


READ: Final = {"view": Provide(fleet_view, sync_to_thread=False)}
"""The dependencies of a route that reads the fleet's names: ``view``, a ``FleetView``."""


def require_metrics_token(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Litestar guard of ``/metrics``: ``DYN_METRICS_TOKEN`` when set; unset, open only while
    no tenant exists (its series name every tenant's models)."""
    token: str | None = connection.app.state.config.metrics_token
    authorization = connection.headers.get("authorization")
    if token:
        if not bearer_token_accepted(authorization, token):
            raise UnauthorizedError(
                "/metrics needs 'Authorization: Bearer <token>' (the frontend's "
                "DYN_METRICS_TOKEN; Prometheus sends it with `authorization: credentials_file`)"
            )
    elif services_of(connection.app.state).tenants.keyed:
        raise UnauthorizedError(
            "/metrics names every tenant's models, so once tenants exist it needs a token: "
            "set DYN_METRICS_TOKEN on the frontend and give it to Prometheus"
        )
