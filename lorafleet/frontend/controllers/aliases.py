"""``/v1/aliases`` and ``/v1/rollouts``: one name over several adapter versions, and canaries.

Aliases are desired state (``v1/aliases/{ns}/{slug}``); every write is checked first
(``AliasChecks``) and stored with a compare-and-swap (``AliasBook.update``), so bad input
answers 4xx and leaves etcd as it was. Writes need the ``DYN_ADMIN_TOKEN`` bearer token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, TypeAlias

from litestar import Controller, Response, delete, get
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from lorafleet.frontend.admin_auth import admin_post, require_admin_token
from lorafleet.frontend.aliases import AliasBook
from lorafleet.frontend.controllers._responses import ADMIN_ERRORS, READ_ERRORS, error_answer
from lorafleet.frontend.errors import names_in_message
from lorafleet.frontend.fleet_reads import EVERY_NAME, READ, FleetView
from lorafleet.frontend.rollout import promote, rollback, start_rollout
from lorafleet.frontend.services import Services
from lorafleet.proto.aliases import (
    Alias,
    AliasList,
    AliasRequest,
    PromoteRequest,
    RollbackRequest,
    RolloutRequest,
    validate_policy,
)
from lorafleet.proto.errors import ConflictError, NotFoundError
from lorafleet.proto.limits import shorten

__all__ = ["AliasesController", "RolloutsController"]

_AliasChange: TypeAlias = Callable[[Alias], Alias]
"""Turns a stored alias into the one to store; raises to refuse."""


WRITE_ERRORS: Final = {
    400: error_answer("Bad targets, weights or policy; the message names the problem"),
    **ADMIN_ERRORS,
    404: error_answer("No such alias"),
    409: error_answer(
        "The name is a served model or a declared adapter, or the rollout's phase does not allow it"
    ),
}


class AliasesController(Controller):
    """The fleet's aliases: set targets, list, describe, delete."""

    path = "/v1/aliases"
    tags = ["aliases"]

    @admin_post(
        "/",
        operation_id="applyAlias",
        summary="Set an alias's targets and weights",
        description="Ends a running rollout. 201 when stored, 200 when it already was.",
        responses=WRITE_ERRORS,
    )
    async def apply(
        self, data: JSONBody[AliasRequest], services: NamedDependency[Services]
    ) -> Response[Alias]:
        """Check ``data`` against the fleet, then store it."""
        services.alias_checks.check_alias(data.name, data.targets)
        wanted = Alias(name=data.name, targets=data.targets)
        before = services.aliases.get(data.name)
        stored = await services.aliases.update(data.name, lambda _current: wanted)
        assert stored is not None  # the change never deletes
        return Response(stored, status_code=200 if before == stored else 201)

    @get("/", operation_id="listAliases", summary="List aliases, their targets and rollouts",
         dependencies=READ, responses=READ_ERRORS)  # fmt: skip
    async def list_aliases(
        self, services: NamedDependency[Services], view: NamedDependency[FleetView]
    ) -> AliasList:
        """Every alias the caller may see, by name."""
        return AliasList(data=[a for a in services.aliases.records() if view.shows_alias(a)])

    @get(
        "/{name:path}",
        operation_id="getAlias",
        summary="Describe one alias and its rollout",
        dependencies=READ,
        responses={404: WRITE_ERRORS[404], **READ_ERRORS},
    )
    async def get_alias(
        self, name: FromPath[str], services: NamedDependency[Services],
        view: NamedDependency[FleetView],
    ) -> Alias:  # fmt: skip
        """One alias (names may contain ``/``); one the caller may not see does not exist."""
        return _alias_or_404(services.aliases, name.lstrip("/"), view)

    @delete(
        "/{name:path}",
        operation_id="deleteAlias",
        summary="Remove an alias",
        status_code=200,
        guards=[require_admin_token],
        responses={404: WRITE_ERRORS[404], 401: WRITE_ERRORS[401]},
    )
    async def delete_alias(self, name: FromPath[str], services: NamedDependency[Services]) -> Alias:
        """Delete alias ``name``; answers what was deleted."""
        alias = _alias_or_404(services.aliases, name.lstrip("/"))
        await services.aliases.update(alias.name, lambda _current: None)
        return alias


class RolloutsController(Controller):
    """Canary rollouts of aliases: start, promote, roll back."""

    path = "/v1/rollouts"
    tags = ["aliases"]

    @admin_post(
        "/",
        operation_id="startRollout",
        status_code=201,
        responses=WRITE_ERRORS,
        summary="Send a share of an alias's requests to a canary under a policy",
    )
    async def start(
        self, data: JSONBody[RolloutRequest], services: NamedDependency[Services]
    ) -> Alias:
        """Check the canary and policy, then give the canary its weight; the alias's other
        targets share the rest in their proportions (``frontend.rollout``)."""
        validate_policy(data.policy)
        services.alias_checks.check_rollout(data)

        def begin(current: Alias | None) -> Alias:
            if current is not None and current.rollout and current.rollout.phase == "running":
                raise ConflictError(
                    f"alias {data.alias!r} has a running rollout of "
                    f"{current.rollout.canary!r}; promote or roll it back first"
                )
            alias = start_rollout(current, data, time.time())
            services.alias_checks.check_alias(alias.name, alias.targets)
            return alias

        stored = await services.aliases.update(data.alias, begin)
        assert stored is not None
        return stored

    @admin_post(
        "/promote",
        operation_id="promoteRollout",
        status_code=200,
        responses=WRITE_ERRORS,
        summary="Move a rollout's canary to its next step",
    )
    async def promote(
        self, data: JSONBody[PromoteRequest], services: NamedDependency[Services]
    ) -> Alias:
        """The next step's weight now (all of it with ``full``); 100 ends the rollout."""
        _alias_or_404(services.aliases, data.alias)
        return await _change(
            services.aliases,
            data.alias,
            lambda alias: promote(alias, full=data.full, now=time.time()),
        )

    @admin_post(
        "/rollback",
        operation_id="rollBackRollout",
        status_code=200,
        responses=WRITE_ERRORS,
        summary="Put an alias's targets back as they were before its rollout",
    )
    async def rollback(
        self, data: JSONBody[RollbackRequest], services: NamedDependency[Services]
    ) -> Alias:
        """The targets as before the rollout; it shows ``rolled_back`` and ``reason``."""
        _alias_or_404(services.aliases, data.alias)
        return await _change(
            services.aliases, data.alias, lambda alias: rollback(alias, data.reason)
        )


async def _change(book: AliasBook, name: str, change: _AliasChange) -> Alias:
    def apply(current: Alias | None) -> Alias:
        if current is None:
            raise _not_found(book, name)
        return change(current)

    stored = await book.update(name, apply)
    assert stored is not None
    return stored


def _alias_or_404(book: AliasBook, name: str, view: FleetView = EVERY_NAME) -> Alias:
    alias = book.get(name)
    if alias is None or not view.shows_alias(alias):
        raise _not_found(book, name, view)
    return alias


def _not_found(book: AliasBook, name: str, view: FleetView = EVERY_NAME) -> NotFoundError:
    known = names_in_message([alias.name for alias in book.records() if view.shows_alias(alias)])
    return NotFoundError(f"alias {shorten(name)!r} does not exist; aliases: {known}")
