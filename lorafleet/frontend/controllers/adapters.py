"""``/v1/adapters``: write and read the fleet's desired adapters (``v1/adapters/{ns}/{slug}``).

Workers place what is written here among themselves; this controller only
stores it and reports each adapter's state (``AdapterStates``: where it is
loaded, what loads it, its last failure, its demand). Reads also show the
adapters loaded straight onto workers (``unmanaged``).
``POST`` and ``DELETE`` need the ``DYN_ADMIN_TOKEN`` bearer token when one is set.
"""

from __future__ import annotations

from typing import Final

from litestar import Controller, Response, delete, get
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from lorafleet.frontend.admin_auth import admin_post, require_admin_token
from lorafleet.frontend.controllers._responses import ADMIN_ERRORS, READ_ERRORS, error_answer
from lorafleet.frontend.desired_state import DesiredState
from lorafleet.frontend.errors import names_in_message
from lorafleet.frontend.fleet_reads import EVERY_NAME, READ, FleetView
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.frontend.services import Services
from lorafleet.proto.adapters import (
    AdapterList,
    AdapterSpec,
    AdapterStatus,
    replica_bounds,
    validate_adapter_spec,
)
from lorafleet.proto.errors import ConflictError, NotFoundError
from lorafleet.proto.limits import shorten

__all__ = ["AdaptersController"]


WRITE_ERRORS: Final = {
    400: error_answer("Invalid spec; the message names the field"),
    **ADMIN_ERRORS,
    409: error_answer("The name is a base model's or an alias's name"),
}
NOT_FOUND: Final = {404: error_answer("No such adapter in the desired state or on any instance")}


def _check_against_served(spec: AdapterSpec, registry: ModelRegistry) -> list[str]:
    """Refuse a name that a base model uses; warn when nothing serves the base model."""
    same_name = registry.get(spec.name)
    if same_name is not None and same_name.parent is None:
        raise ConflictError(f"name {spec.name!r} is a base model that live instances serve")
    base = registry.get(spec.base_model)
    if base is None or base.parent is not None:
        return [
            f"no live instance serves base model {spec.base_model!r} now; the adapter is "
            "placed (or loaded on demand) once one does"
        ]
    return []


def _slo_room(spec: AdapterSpec) -> list[str]:
    """Warn when latency targets can add no copy: the bounds leave no room above the lower."""
    low, high = replica_bounds(spec)
    if spec.slo is None or high == "all" or (low != "all" and low < high):
        return []
    return [
        f"slo targets are measured and shown, but can add no copy: max_replicas is {high}; "
        "raise max_replicas to let a missed target add copies"
    ]


class AdaptersController(Controller):
    """The fleet's desired adapters: apply, list, describe, delete."""

    path = "/v1/adapters"
    tags = ["adapters"]

    @admin_post(
        "/",
        operation_id="applyAdapter",
        summary="Create or update an adapter's desired state",
        description="201 when the stored state changed, 200 when it already was exactly this.",
        responses=WRITE_ERRORS,
    )
    async def apply(
        self,
        data: JSONBody[AdapterSpec],
        services: NamedDependency[Services],
    ) -> Response[AdapterStatus]:
        """Validate and store ``data`` as desired state (persistent, no lease)."""
        spec = validate_adapter_spec(data)
        services.alias_checks.check_adapter_name(spec.name)
        warnings = _check_against_served(spec, services.registry) + _slo_room(spec)
        changed = await services.desired.apply(spec)
        return Response(
            services.adapters.status(spec, warnings), status_code=201 if changed else 200
        )

    @get("/", operation_id="listAdapters", summary="List the fleet's adapters and their state",
         dependencies=READ, responses=READ_ERRORS)  # fmt: skip
    async def list_adapters(
        self, services: NamedDependency[Services], view: NamedDependency[FleetView]
    ) -> AdapterList:
        """Every adapter the caller may see by name, with its state and the instances that
        have it: the desired ones, and those loaded straight onto workers (``unmanaged``, or
        ``evicted``)."""
        return AdapterList(data=[s for s in services.adapters.every() if view.shows(s.name)])

    @get(
        "/{name:path}",
        operation_id="getAdapter",
        summary="Describe one adapter, desired or unmanaged",
        dependencies=READ,
        responses={**NOT_FOUND, **READ_ERRORS},
    )
    async def get_adapter(
        self,
        name: FromPath[str],
        services: NamedDependency[Services],
        view: NamedDependency[FleetView],
    ) -> AdapterStatus:
        """One adapter (names may contain ``/``); one the caller may not see does not exist."""
        name = name.lstrip("/")
        found = services.adapters.find(name) if view.shows(name) else None
        if found is None:
            raise _not_found(services.desired, name, view)
        return found

    @delete(
        "/{name:path}",
        operation_id="deleteAdapter",
        summary="Remove an adapter from the desired state",
        description="Workers unload the copies the fleet put there once they are idle.",
        status_code=200,
        guards=[require_admin_token],
        responses={**NOT_FOUND, 401: WRITE_ERRORS[401]},
    )
    async def delete_adapter(
        self,
        name: FromPath[str],
        services: NamedDependency[Services],
    ) -> AdapterStatus:
        """Delete the desired state of ``name``; answers what was deleted."""
        name = name.lstrip("/")
        if services.desired.get(name) is None and services.adapters.find(name) is not None:
            raise NotFoundError(
                f"adapter {shorten(name)!r} is not in the desired state: it is loaded straight "
                "onto instances (unmanaged); POST /v1/unload_lora_adapter removes it from them"
            )
        spec = _desired_or_404(services.desired, name)
        if not await services.desired.delete(name):
            raise NotFoundError(f"adapter {shorten(name)!r} is not in the desired state")
        return services.adapters.status(spec)


def _desired_or_404(desired: DesiredState, name: str) -> AdapterSpec:
    spec = desired.get(name)
    if spec is None:
        raise _not_found(desired, name)
    return spec


def _not_found(desired: DesiredState, name: str, view: FleetView = EVERY_NAME) -> NotFoundError:
    known = names_in_message(view.shown(spec.name for spec in desired.records()))
    return NotFoundError(f"adapter {shorten(name)!r} is not in the desired state; desired: {known}")
