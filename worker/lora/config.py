"""The LoRA manager's configuration: one frozen object, validated once, readable from DYN_LORA_*.

The AWS settings are not here: boto3 reads the standard AWS environment itself.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from lorafleet.fleet.adapter_files import ALLOW_PICKLE_VARIABLE
from lorafleet.proto.uris import is_scheme_name
from lorafleet.worker.lora.errors import LoraConfigError
from lorafleet.worker.lora.source import LoRASource

__all__ = ["DEFAULT_CACHE_DIR", "LoRAManagerConfig", "load_source"]

DEFAULT_CACHE_DIR: Final = Path("~/.cache/lorafleet/loras")
DEFAULT_DOWNLOAD_TIMEOUT_S: Final = 3600.0
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"", "0", "false", "no", "off"})


def _default_cache_dir() -> Path:
    return DEFAULT_CACHE_DIR.expanduser()


@dataclass(frozen=True, kw_only=True)
class LoRAManagerConfig:
    """Where adapters are cached and which sources may be used.

    Examples::

        LoRAManagerConfig()                                   # ~/.cache/lorafleet/loras, any scheme
        LoRAManagerConfig(cache_dir=Path("/data/loras"), cache_max_bytes=20 << 30)
        LoRAManagerConfig(file_roots=(Path("/models"),), allowed_schemes=frozenset({"file"}))
    """

    cache_dir: Path = field(default_factory=_default_cache_dir)
    file_roots: tuple[Path, ...] = ()
    """``file://`` paths must lie under one of these; empty means anywhere."""
    allowed_schemes: frozenset[str] | None = None
    """Schemes that may be used; None means every scheme that has a source."""
    cache_max_bytes: int | None = None
    """Evict least recently used unused entries above this total; None means no cap."""
    sources: tuple[tuple[str, str], ...] = ()
    """``(scheme, "module:attr")`` pairs of configured sources, tried in this order."""
    download_timeout_s: float = DEFAULT_DOWNLOAD_TIMEOUT_S
    """``DYN_LORA_DOWNLOAD_TIMEOUT_S``: one source's whole download of one adapter fails
    after this long (a source that hangs mid-download), and a later load tries again."""
    max_adapter_bytes: int | None = None
    """Refuse one adapter larger than this: from the source's listing before the download
    where the source has one (S3), and while any source writes; None means no bound."""
    allow_pickle: bool = False
    """Load ``adapter_model.bin`` (a pickle, which can run code); safetensors only when False."""

    def __post_init__(self) -> None:
        for variable, value in (
            ("DYN_LORA_CACHE_MAX_BYTES", self.cache_max_bytes),
            ("DYN_LORA_MAX_BYTES", self.max_adapter_bytes),
        ):
            if value is not None and value <= 0:
                raise LoraConfigError(f"{variable} must be positive, got {value}")
        if any(not root.is_absolute() for root in self.file_roots):
            raise LoraConfigError(f"DYN_LORA_FILE_ROOTS must be absolute paths: {self.file_roots}")
        bad = [s for s in (self.allowed_schemes or ()) if not is_scheme_name(s)]
        bad += [scheme for scheme, spec in self.sources if not is_scheme_name(scheme)]
        if bad:
            raise LoraConfigError(f"invalid scheme names (lower-case, e.g. 's3'): {sorted(bad)}")
        if self.download_timeout_s <= 0:
            raise LoraConfigError(
                f"DYN_LORA_DOWNLOAD_TIMEOUT_S must be positive, got {self.download_timeout_s}"
            )
        self._check_sources_allowed()

    def _check_sources_allowed(self) -> None:
        if self.allowed_schemes is None:
            return
        refused = sorted({s for s, _ in self.sources} - self.allowed_schemes)
        if refused:
            raise LoraConfigError(
                f"DYN_LORA_SOURCES names schemes {refused} that DYN_LORA_ALLOWED_SCHEMES "
                f"({sorted(self.allowed_schemes)}) does not allow; add them there or drop them"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LoRAManagerConfig:
        """Read ``DYN_LORA_{PATH,FILE_ROOTS,SOURCES,ALLOWED_SCHEMES,CACHE_MAX_BYTES,MAX_BYTES,
        ALLOW_PICKLE,DOWNLOAD_TIMEOUT_S}``."""
        env = os.environ if environ is None else environ
        path = env.get("DYN_LORA_PATH", "").strip()
        roots = env.get("DYN_LORA_FILE_ROOTS", "")
        allowed = _split(env.get("DYN_LORA_ALLOWED_SCHEMES", ""))
        return cls(
            cache_dir=Path(path).expanduser() if path else _default_cache_dir(),
            file_roots=tuple(Path(r).expanduser() for r in roots.split(os.pathsep) if r.strip()),
            allowed_schemes=frozenset(s.lower() for s in allowed) if allowed else None,
            cache_max_bytes=_parse_bytes(env, "DYN_LORA_CACHE_MAX_BYTES"),
            max_adapter_bytes=_parse_bytes(env, "DYN_LORA_MAX_BYTES"),
            allow_pickle=_parse_bool(env, ALLOW_PICKLE_VARIABLE),
            sources=tuple(_parse_source(item) for item in _split(env.get("DYN_LORA_SOURCES", ""))),
            download_timeout_s=_parse_seconds(env.get("DYN_LORA_DOWNLOAD_TIMEOUT_S", "")),
        )


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _parse_bytes(env: Mapping[str, str], variable: str) -> int | None:
    value = env.get(variable, "").strip().replace("_", "")
    if not value or value == "0":
        return None
    if not value.isdigit():
        raise LoraConfigError(f"{variable} must be a byte count, got {value!r}")
    return int(value)


def _parse_bool(env: Mapping[str, str], variable: str) -> bool:
    value = env.get(variable, "").strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise LoraConfigError(f"{variable} must be true or false, got {value!r}")


def _parse_seconds(value: str) -> float:
    if not value.strip():
        return DEFAULT_DOWNLOAD_TIMEOUT_S
    try:
        return float(value)
    except ValueError:
        raise LoraConfigError(
            f"DYN_LORA_DOWNLOAD_TIMEOUT_S must be seconds (e.g. 600), got {value!r}"
        ) from None


def _parse_source(item: str) -> tuple[str, str]:
    scheme, sep, spec = item.partition("=")
    module, colon, attr = spec.strip().partition(":")
    if not sep or not colon or not module or not attr:
        raise LoraConfigError(
            f"DYN_LORA_SOURCES entry {item!r} is not scheme=module:attr (e.g. hf=pkg.mod:Source)"
        )
    return scheme.strip().lower(), spec.strip()


def load_source(scheme: str, spec: str) -> LoRASource:
    """Import ``module:attr``; a class or factory is called without arguments to build it."""
    module_name, _, attr_path = spec.partition(":")
    try:
        target: object = importlib.import_module(module_name)
        for attr in attr_path.split("."):
            target = getattr(target, attr)
    except (ImportError, AttributeError) as exc:
        raise LoraConfigError(
            f"DYN_LORA_SOURCES: cannot load {spec!r} for scheme {scheme!r} "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if isinstance(target, type) or (callable(target) and not isinstance(target, LoRASource)):
        try:
            target = target()
        except Exception as exc:
            raise LoraConfigError(
                f"DYN_LORA_SOURCES: calling {spec!r} for scheme {scheme!r} without arguments "
                f"failed ({type(exc).__name__})"
            ) from exc
    if not isinstance(target, LoRASource):
        raise LoraConfigError(
            f"DYN_LORA_SOURCES: {spec!r} for scheme {scheme!r} has no async download(uri, dest) "
            "and exists(uri)"
        )
    return target
