"""``/v1/tenants`` and ``/v1/keys``: who may call the OpenAI routes, with which limits.

Every route here, reads included, needs the ``DYN_ADMIN_TOKEN`` bearer token: the list
of tenants and keys is the operator's business. A key is answered once, when created;
etcd holds only its sha256 (``frontend.tenants``).
"""

from __future__ import annotations

from typing import Final

from litestar import Controller, delete, get
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from lorafleet.frontend.admin_auth import admin_post, require_admin_token
from lorafleet.frontend.controllers._responses import ADMIN_ERRORS, error_answer
from lorafleet.frontend.services import Services
from lorafleet.proto.tenants import ApiKeyCreated, ApiKeyList, ApiKeyRequest, Tenant, TenantList

__all__ = ["KeysController", "TenantsController"]


ERRORS: Final = {
    400: error_answer("A bad field, or a key for a tenant that does not exist"),
    **ADMIN_ERRORS,
    404: error_answer("No such tenant or key"),
    409: error_answer("The tenant still has keys"),
}


class TenantsController(Controller):
    """Tenants: their model patterns and limits."""

    path = "/v1/tenants"
    tags = ["tenants"]
    guards = [require_admin_token]

    @admin_post("/", operation_id="putTenant", summary="Create or replace a tenant",
                status_code=200, responses=ERRORS)  # fmt: skip
    async def put(self, data: JSONBody[Tenant], services: NamedDependency[Services]) -> Tenant:
        """Store ``data``; every frontend applies it within its watch latency."""
        return await services.tenants.put_tenant(data)

    @get("/", operation_id="listTenants", summary="List tenants", responses={401: ERRORS[401]})
    async def list_tenants(self, services: NamedDependency[Services]) -> TenantList:
        """Every tenant by name."""
        return TenantList(data=services.tenants.tenants())

    @delete("/{name:str}", operation_id="deleteTenant", summary="Delete a tenant without keys",
            status_code=204, responses=ERRORS)  # fmt: skip
    async def delete_tenant(self, name: FromPath[str], services: NamedDependency[Services]) -> None:
        """Delete tenant ``name`` (409 while it has keys)."""
        await services.tenants.delete_tenant(name)


class KeysController(Controller):
    """API keys: create (answered once), list (ids only), revoke."""

    path = "/v1/keys"
    tags = ["tenants"]
    guards = [require_admin_token]

    @admin_post("/", operation_id="createKey", summary="Create an API key for a tenant",
                status_code=201, responses=ERRORS)  # fmt: skip
    async def create(
        self, data: JSONBody[ApiKeyRequest], services: NamedDependency[Services]
    ) -> ApiKeyCreated:
        """A new key: shown in this answer only, stored as its sha256."""
        return await services.tenants.create_key(data.tenant, data.note)

    @get("/", operation_id="listKeys", summary="List API keys by id", responses={401: ERRORS[401]})
    async def list_keys(self, services: NamedDependency[Services]) -> ApiKeyList:
        """Every key's id, tenant and creation time."""
        return ApiKeyList(data=services.tenants.key_views())

    @delete("/{key_id:str}", operation_id="revokeKey", summary="Revoke an API key",
            status_code=204, responses=ERRORS)  # fmt: skip
    async def revoke(self, key_id: FromPath[str], services: NamedDependency[Services]) -> None:
        """Delete the key with id ``key_id``: refused by every frontend within a second."""
        await services.tenants.revoke_key(key_id)
