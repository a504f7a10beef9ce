"""Tenants and their API keys: who may call the OpenAI routes, which models, how much.

A ``Tenant`` is desired state (``v1/tenants/{namespace}/{name}``, no lease) and an
``ApiKeyRecord`` names one key's tenant (``v1/keys/{namespace}/{sha256 of the key}``,
no lease): the key itself is never stored. Keys are 32 random bytes, so a plain sha256
is as hard to reverse as the key is to guess; a slow KDF would only cost CPU per
request. A ``FrontendPresence`` marks one live frontend (``v1/frontends/{namespace}/{id}``,
under its lease), so each frontend enforces its share of every tenant's limits.
"""

from __future__ import annotations

import fnmatch
import hashlib
from typing import Annotated, Final

import msgspec

from lorafleet.proto.limits import MAX_SAFE_INT

__all__ = [
    "API_KEY_PREFIX",
    "ApiKeyCreated",
    "ApiKeyList",
    "ApiKeyRecord",
    "ApiKeyRequest",
    "ApiKeyView",
    "FrontendPresence",
    "MIN_REQUESTS_PER_S",
    "Tenant",
    "TenantList",
    "TenantName",
    "decode_api_key",
    "decode_presence",
    "decode_tenant",
    "key_hash",
    "key_id",
    "may_use",
    "tenant_cache_salt",
]

API_KEY_PREFIX: Final = "lf-"
"""Every key starts with this, so a leaked one is easy to find in logs and repositories."""
KEY_ID_CHARS: Final = 12
"""How many hex digits of a key's hash name it in lists and ``revoke`` (never the key)."""

MIN_REQUESTS_PER_S: Final = 0.001
"""The slowest request rate a tenant may have (one request in about 17 minutes): a rate
nearer zero is a mistake, and its ``Retry-After`` would be a number of hundreds of digits."""

Limit = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INT)]
"""A count limit: 0 for none, else at most ``MAX_SAFE_INT``."""

TenantName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
ModelPattern = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
MAX_PATTERNS: Final = 256


class Tenant(msgspec.Struct, kw_only=True, frozen=True):
    """One team: the models it may use and its limits over the whole fleet (0: no limit).

    ``models`` are ``fnmatch`` patterns over the requested name (``team-a-*``, ``*``).
    """

    name: TenantName
    models: Annotated[list[ModelPattern], msgspec.Meta(min_length=1, max_length=MAX_PATTERNS)] = (
        msgspec.field(default_factory=lambda: ["*"])
    )
    requests_per_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_SAFE_INT)] = 0.0
    """0, or at least ``MIN_REQUESTS_PER_S``."""
    tokens_per_min: Limit = 0
    """Prompt plus completion tokens per minute."""
    max_concurrent: Limit = 0
    priority: Annotated[int, msgspec.Meta(ge=0, le=9)] = 0
    """Higher is served first while the fleet is saturated; the lowest is shed first
    (``lorafleet/frontend/admission.py``)."""
    salt_cache: bool = False
    """Salt every request with the tenant's name (``tenant_cache_salt``): its prompts never
    share prefix-cache blocks with another tenant's (``docs/routing.md``)."""

    def __post_init__(self) -> None:
        """Refuse a rate above zero but below ``MIN_REQUESTS_PER_S`` (msgspec makes the
        ``ValueError`` a validation error: a 400 over HTTP, a skipped record in etcd)."""
        if 0 < self.requests_per_s < MIN_REQUESTS_PER_S:
            raise ValueError(
                f"requests_per_s is {self.requests_per_s:g}; use 0 for no limit or at least "
                f"{MIN_REQUESTS_PER_S:g}"
            )


def tenant_cache_salt(tenant: str, salt: str) -> str:
    """The cache salt of a request of a tenant that salts its requests: its name, then the
    request's own salt (blocks are shared only within the tenant, and within that salt)."""
    return f"{tenant}\0{salt}"


class TenantList(msgspec.Struct, kw_only=True, frozen=True):
    """Answer of ``GET /v1/tenants``."""

    data: list[Tenant]
    object: str = "list"


class ApiKeyRecord(msgspec.Struct, kw_only=True, frozen=True):
    """What etcd holds for one key, under the key's hash: its tenant and when it was made."""

    tenant: TenantName
    created: int
    """Unix seconds."""
    note: str = ""


class ApiKeyRequest(msgspec.Struct, kw_only=True, frozen=True):
    """Body of ``POST /v1/keys``: a new key for ``tenant`` (which must exist)."""

    tenant: TenantName
    note: Annotated[str, msgspec.Meta(max_length=200)] = ""


class ApiKeyView(msgspec.Struct, kw_only=True, frozen=True):
    """One key as lists show it: its id (a prefix of its hash), never the key."""

    id: str
    tenant: str
    created: int
    note: str = ""


class ApiKeyCreated(msgspec.Struct, kw_only=True, frozen=True):
    """Answer of ``POST /v1/keys``: the key, shown this once and stored nowhere."""

    key: str
    id: str
    tenant: str


class ApiKeyList(msgspec.Struct, kw_only=True, frozen=True):
    """Answer of ``GET /v1/keys``."""

    data: list[ApiKeyView]
    object: str = "list"


class FrontendPresence(msgspec.Struct, kw_only=True, frozen=True):
    """One live frontend (under its lease): counted to split tenants' limits."""

    started: int


def key_hash(key: str) -> str:
    """The hex sha256 of ``key``: its etcd name. See the module docstring for why not a KDF."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(hashed: str) -> str:
    """The short id of a key by its hash, as lists and ``revoke`` name it."""
    return hashed[:KEY_ID_CHARS]


def may_use(tenant: Tenant, model: str) -> bool:
    """True when one of the tenant's patterns matches ``model`` (case-sensitive)."""
    return any(fnmatch.fnmatchcase(model, pattern) for pattern in tenant.models)


_tenant_decoder: Final = msgspec.json.Decoder(Tenant)
_key_decoder: Final = msgspec.json.Decoder(ApiKeyRecord)
_presence_decoder: Final = msgspec.json.Decoder(FrontendPresence)


def decode_tenant(raw: bytes) -> Tenant:
    """Decode a tenant record (raises msgspec errors on bad input)."""
    return _tenant_decoder.decode(raw)


def decode_api_key(raw: bytes) -> ApiKeyRecord:
    """Decode a key record (raises msgspec errors on bad input)."""
    return _key_decoder.decode(raw)


def decode_presence(raw: bytes) -> FrontendPresence:
    """Decode a frontend's presence record."""
    return _presence_decoder.decode(raw)
