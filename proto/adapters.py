"""LoRA administration bodies: load, unload, list, and the fleet's desired state.

The same Structs serve the worker's status server, the NATS update path and
the CLI. :func:`validate_lora_name` is the one place that decides which names
are acceptable.
"""

from __future__ import annotations

import re
from typing import Final, Literal

import msgspec

from proto.errors import InvalidRequestError

__all__ = [
    "AdapterSpec",
    "LoadLoraRequest",
    "LoraListResponse",
    "LoraResponse",
    "LoraSource",
    "UnloadLoraRequest",
    "validate_lora_name",
]

MAX_LORA_NAME_CHARS: Final = 256
_NAME_SEGMENT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class LoraSource(msgspec.Struct, kw_only=True, frozen=True):
    """Where an adapter comes from: ``file://``, ``s3://`` or a registered scheme."""

    uri: str


class LoadLoraRequest(msgspec.Struct, kw_only=True, frozen=True):
    """Body of ``POST /engine/update/load_lora`` and ``POST /v1/loras``."""

    lora_name: str
    source: LoraSource


class UnloadLoraRequest(msgspec.Struct, kw_only=True, frozen=True):
    """Body of ``POST /engine/update/unload_lora``."""

    lora_name: str


class LoraResponse(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=False):
    """Answer to a load or unload: ``status`` is ``success`` or ``error``."""

    status: Literal["success", "error"]
    message: str = ""
    lora_name: str | None = None
    lora_id: int | None = None


class LoraListResponse(msgspec.Struct, kw_only=True, frozen=True):
    """Answer to a list: every loaded adapter's name and ``lora_id``."""

    loras: dict[str, int]
    count: int
    status: Literal["success", "error"] = "success"


class AdapterSpec(msgspec.Struct, kw_only=True, frozen=True):
    """Desired state of one adapter in the fleet (``v1/adapters/{namespace}/{slug}``)."""

    name: str
    base_model: str
    source: LoraSource
    replicas: int | Literal["all"] = 1
    pinned: bool = False


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
