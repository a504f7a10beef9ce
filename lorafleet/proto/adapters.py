"""LoRA administration bodies: load, unload, list, and the fleet's desired state.

The same Structs serve the worker's status server, the NATS update path, the
frontend's ``/v1/adapters`` and the CLI. :func:`validate_lora_name` is the one
place that decides which names are acceptable, :func:`validate_adapter_spec`
which desired states are.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal, TypeAlias

import msgspec

from lorafleet.proto.errors import InvalidRequestError
from lorafleet.proto.limits import MAX_MODEL_NAME_CHARS, MAX_URI_CHARS
from lorafleet.proto.slo import MAX_SLO_MS, SloAttainment, SloTargets
from lorafleet.proto.uris import split_uri

__all__ = [
    "AdapterEviction",
    "AdapterList",
    "AdapterLoadError",
    "AdapterSpec",
    "AdapterState",
    "AdapterStatus",
    "ListLorasRequest",
    "LoadLoraRequest",
    "LoraListResponse",
    "LoraResponse",
    "LoraSource",
    "LoraUpdate",
    "UnloadLoraRequest",
    "decode_adapter_spec",
    "encode_adapter_spec",
    "expected_digest",
    "replica_bounds",
    "validate_adapter_spec",
    "validate_lora_name",
]

MAX_LORA_NAME_CHARS: Final = 256
MAX_REPLICAS: Final = 65_536
"""Most copies of one adapter a desired state may ask for (``"all"``: every instance)."""

LoraName = Annotated[str, msgspec.Meta(max_length=MAX_LORA_NAME_CHARS)]
BaseModelName = Annotated[str, msgspec.Meta(max_length=MAX_MODEL_NAME_CHARS)]
Uri = Annotated[str, msgspec.Meta(max_length=MAX_URI_CHARS)]
Replicas = Annotated[
    Annotated[int, msgspec.Meta(le=MAX_REPLICAS)] | Literal["all"],
    msgspec.Meta(description=f'0 to {MAX_REPLICAS} copies, or "all" instances'),
]
SHA256_PATTERN: Final = r"^(sha256:)?[0-9a-fA-F]{64}$"
Sha256 = Annotated[
    str,
    msgspec.Meta(
        pattern=SHA256_PATTERN,
        description="the adapter's content digest: sha256:<64 hex> or 64 hex",
    ),
]
_NAME_SEGMENT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
AdapterState = Literal[
    "placed", "loading", "failed", "pending", "cold", "unplaceable", "unmanaged", "evicted"
]
"""Where an adapter stands (``docs/fleet.md``, "Adapter status"): the first six for a
desired one (``unplaceable``: no live instance of its base model can take it);
``unmanaged`` for one loaded straight onto workers (not in the desired state), ``evicted``
for such an adapter that placement evicted (its source and digest are kept)."""


class LoraSource(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """Where an adapter comes from: ``file://``, ``s3://`` or a registered scheme."""

    uri: Uri
    sha256: Sha256 | None = None
    """The content digest the adapter must have (``worker.lora.digest``); a load whose files
    digest otherwise is refused with 409 before an engine reads them (``expected_digest``)."""


class _Update(msgspec.Struct, kw_only=True, frozen=True, tag_field="update"):
    """Base of the update bodies: the tag names the update (``update/<tag>``), so a NATS
    ``UpdateRequest`` carries them as one tagged union (``LoraUpdate``). A body without the
    tag still decodes as its own type (HTTP callers, and workers before the tag)."""


class LoadLoraRequest(_Update, frozen=True, omit_defaults=True, tag="load_lora"):
    """Body of ``POST /engine/update/load_lora`` and ``POST /v1/loras`` (a default field is
    left off the wire, so a plain load reads as it did before ``evict_placed``)."""

    lora_name: LoraName
    source: LoraSource
    evict_placed: bool = True
    """False: answer 429 ``capacity`` rather than evict a copy placement chose this instance
    for (placement would load it back: two loads for one). Frontends' on-demand loads ask
    every instance so first, then again allowing it."""
    replace: bool = False
    """True: swap an adapter loaded from another source to this one, make before break
    (vLLM's ``load_inplace``). A load from the same source swaps only if its files
    changed; the same weights are a no-op that says so."""


class UnloadLoraRequest(_Update, frozen=True, tag="unload_lora"):
    """Body of ``POST /engine/update/unload_lora``."""

    lora_name: LoraName


class ListLorasRequest(_Update, frozen=True, tag="list_loras"):
    """Body of ``POST /engine/update/list_loras``: nothing is needed (any fields are ignored)."""


LoraUpdate: TypeAlias = LoadLoraRequest | UnloadLoraRequest | ListLorasRequest
"""Every update body, tagged by its update's name (``UpdateRequest.update``)."""


class LoraResponse(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=False):
    """Answer to a load or unload: ``status`` is ``success`` or ``error``."""

    status: Literal["success", "error"]
    message: str = ""
    lora_name: str | None = None
    lora_id: int | None = None
    digest: str = ""
    """The content digest of the version serving now (``sha256:<hex>``)."""
    warnings: list[str] = msgspec.field(default_factory=list)
    """What the load let through but an operator should know (e.g. the adapter was trained
    for another base model, under ``DYN_LORA_BASE_MODEL_CHECK=warn``)."""


class LoraListResponse(msgspec.Struct, kw_only=True, frozen=True):
    """Answer to a list: every loaded adapter's name, ``lora_id`` and digest."""

    loras: dict[str, int]
    count: int
    status: Literal["success", "error"] = "success"
    digests: dict[str, str] = msgspec.field(default_factory=dict)
    """Each adapter's content digest: the weights the engine holds for it."""


class AdapterSpec(msgspec.Struct, kw_only=True, frozen=True):
    """Desired state of one adapter in the fleet (``v1/adapters/{namespace}/{slug}``)."""

    name: LoraName
    base_model: BaseModelName
    source: LoraSource
    replicas: Replicas = 1
    """Shorthand for ``min_replicas`` = ``max_replicas`` = ``replicas`` (each overrides it)."""
    min_replicas: Replicas | None = None
    """Copies kept loaded whatever the demand (default: ``replicas``)."""
    max_replicas: Replicas | None = None
    """Most copies demand may add (default: ``replicas``, or ``min_replicas`` if larger)."""
    pinned: bool = False
    slo: SloTargets | None = None
    """Latency targets: while the adapter misses one and has demand, placement adds a copy
    (up to ``max_replicas``); ``docs/slo.md``."""


class AdapterLoadError(msgspec.Struct, kw_only=True, frozen=True):
    """An adapter's last failed load, as ``/v1/adapters`` and ``/v1/models`` show it."""

    code: str
    """The worker's error code (``proto.errors``), e.g. ``not_found`` for a missing source."""
    message: str
    """The worker's message, URIs redacted."""
    at: str
    """When it failed, ISO 8601 UTC."""
    instance: str
    """Hex id of the instance it failed on."""
    attempts: int = 1
    """Failed attempts in a row."""
    retry_at: str | None = None
    """When it is tried again (ISO 8601 UTC); None when only a request tries it again."""


class AdapterEviction(msgspec.Struct, kw_only=True, frozen=True):
    """When and where placement evicted an unmanaged adapter, as ``/v1/adapters`` shows it."""

    at: str
    """When, ISO 8601 UTC."""
    instance: str
    """Hex id of the instance it was evicted from."""
    reason: str = ""
    """Why, in the worker's words (e.g. the slot went to a desired adapter)."""


class AdapterStatus(AdapterSpec, kw_only=True, frozen=True):
    """An adapter's desired state (URI redacted), its state, and where it is loaded now.

    Answer of ``GET /v1/adapters/{name}`` and of ``POST /v1/adapters``. ``min_replicas``
    and ``max_replicas`` are the bounds in force (``replica_bounds``), never None.
    """

    instances: list[str] = msgspec.field(default_factory=list)
    """Lower-case hex ids of the live instances that have the adapter's card."""
    cache_hit_ratio: dict[str, float] = msgspec.field(default_factory=dict)
    """Each of ``instances`` whose engine has looked up prompts in its prefix cache: the
    share of prompt tokens found cached since the worker started (vLLM's
    ``prefix_cache_hits / prefix_cache_queries``, every model of the instance together)."""
    warnings: list[str] = msgspec.field(default_factory=list)
    """Why the adapter may not be served yet (e.g. no live instance serves its base model)."""
    state: AdapterState = "pending"
    """``placed``, ``loading``, ``failed``, ``pending`` (placement will load it), ``cold``
    (``min_replicas`` 0: the first request loads it) or ``unplaceable`` (no live instance
    can take it: nobody tries)."""
    loading: list[str] = msgspec.field(default_factory=list)
    """Hex ids of the instances loading it now."""
    demand: float = 0.0
    """Recent requests per second across the fleet (the workers' load records)."""
    error: AdapterLoadError | None = None
    """The last failed load while ``state`` is ``failed``."""
    digest: str = ""
    """The content digest (``sha256:<hex>``) of the weights its live instances hold, as
    their cards say ("" while no card says one). Several while a swap is under way: the
    first instance's."""
    evicted: AdapterEviction | None = None
    """While ``state`` is ``evicted``: when placement evicted it, where, and why."""
    unplaceable: str = ""
    """While ``state`` is ``unplaceable``: why no live instance can take it (its rank
    against theirs), and what to do."""
    attainment: SloAttainment | None = None
    """With ``slo`` targets: the fleet's last judged window, and the copies the targets
    added and why."""


class AdapterList(msgspec.Struct, kw_only=True, frozen=True):
    """Answer of ``GET /v1/adapters``: every adapter the fleet serves or declares, sorted by
    name (desired ones, then unmanaged ones loaded straight onto workers)."""

    data: list[AdapterStatus]
    object: Literal["list"] = "list"


def replica_bounds(spec: AdapterSpec) -> tuple[int | Literal["all"], int | Literal["all"]]:
    """The fewest and the most copies of ``spec`` the fleet keeps (``"all"``: every instance)."""
    low = spec.replicas if spec.min_replicas is None else spec.min_replicas
    high = spec.replicas if spec.max_replicas is None else spec.max_replicas
    if spec.max_replicas is None and _more(low, high):
        high = low
    return low, high


def _more(a: int | Literal["all"], b: int | Literal["all"]) -> bool:
    return a != b and (a == "all" or (b != "all" and a > b))


_spec_decoder = msgspec.json.Decoder(AdapterSpec)


def decode_adapter_spec(raw: bytes) -> AdapterSpec:
    """Decode a desired-state record (raises msgspec errors on bad input)."""
    return _spec_decoder.decode(raw)


def encode_adapter_spec(spec: AdapterSpec) -> bytes:
    """Encode a desired-state record as indented JSON, readable through ``etcdctl``."""
    return msgspec.json.format(msgspec.json.encode(spec), indent=2)


def validate_adapter_spec(spec: AdapterSpec) -> AdapterSpec:
    """Return ``spec`` if it can be stored as desired state, else raise ``InvalidRequestError``."""
    try:
        validate_lora_name(spec.name, base_model=spec.base_model)
    except InvalidRequestError as exc:
        raise InvalidRequestError(exc.message.replace("lora_name", "name", 1)) from None
    if not spec.base_model.strip():
        raise InvalidRequestError(f"base_model of adapter {spec.name!r} must be non-empty")
    if spec.replicas != "all" and spec.replicas < 0:
        raise InvalidRequestError(
            f"replicas of adapter {spec.name!r} is {spec.replicas}; use a number >= 0 "
            '(0 loads it only on demand) or "all"'
        )
    for field in ("min_replicas", "max_replicas"):
        value = getattr(spec, field)
        if value is not None and value != "all" and value < 0:
            raise InvalidRequestError(
                f'{field} of adapter {spec.name!r} is {value}; use a number >= 0 or "all"'
            )
    low, high = replica_bounds(spec)
    if _more(low, high):
        raise InvalidRequestError(
            f"min_replicas of adapter {spec.name!r} ({low}) is more than its "
            f"max_replicas ({high}); lower min_replicas or raise max_replicas"
        )
    _check_targets(spec)
    if split_uri(spec.source.uri) is None:
        raise InvalidRequestError(
            f"source.uri of adapter {spec.name!r} is not a URI with a scheme; "
            "use e.g. file:///path or s3://bucket/prefix"
        )
    return spec


def _check_targets(spec: AdapterSpec) -> None:
    """Refuse a target that is not a positive number of milliseconds up to ``MAX_SLO_MS``."""
    if spec.slo is None:
        return
    for field in ("ttft_p95_ms", "itl_p95_ms"):
        value = getattr(spec.slo, field)
        if value is not None and not 0 < value <= MAX_SLO_MS:  # NaN fails too
            raise InvalidRequestError(
                f"slo.{field} of adapter {spec.name!r} is {value}; use milliseconds above 0 "
                f"and at most {MAX_SLO_MS:.0f}, or leave it out for no target"
            )


def expected_digest(source: LoraSource) -> str | None:
    """The digest ``source`` asks for as the workers write it (``sha256:<lower hex>``), or
    None when it asks for none. ``source.sha256`` was checked when it was decoded."""
    if source.sha256 is None:
        return None
    return "sha256:" + source.sha256.removeprefix("sha256:").lower()


def validate_lora_name(name: str, *, base_model: str | None = None) -> str:
    """Return ``name`` if it is usable as an adapter name, else raise ``InvalidRequestError``.

    Names may hold ``/``-separated segments (``org/adapter``) but no empty, ``.``
    or ``..`` segment, no backslash and nothing that could escape a directory.
    """
    if not name or not name.strip():
        raise InvalidRequestError("lora_name must be a non-empty string")
    if len(name) > MAX_LORA_NAME_CHARS:
        raise InvalidRequestError(
            f"lora_name is {len(name)} characters long; at most {MAX_LORA_NAME_CHARS} are allowed"
        )
    for segment in name.split("/"):
        if segment in ("", ".", "..") or not _NAME_SEGMENT.fullmatch(segment):
            raise InvalidRequestError(
                f"lora_name {name!r} is not safe: use letters, digits, '.', '_', '-' "
                "in '/'-separated segments that start with a letter or digit"
            )
    if base_model is not None and name == base_model:
        raise InvalidRequestError(
            f"lora_name {name!r} is the base model's name; choose another name for the adapter"
        )
    return name
