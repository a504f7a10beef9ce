"""The LoRA manager's configuration: one frozen object whose ``DYN_LORA_*`` settings are each
declared once (``process.settings``), validated once, and listed in the README's table.

The worker reads them with its other settings (``WorkerConfig.lora``); Dynamo's
``LoRAManager()`` reads them from the environment (``from_env``). They have no flags: the
environment is what both readers, and ``lorafleet up`` (``lorafleet/launch/file_roots.py``),
see. The AWS settings are not here: boto3 reads the standard AWS environment itself.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final

from lorafleet.fleet.adapter_files import ALLOW_PICKLE_VARIABLE
from lorafleet.process.settings import POSITIVE, Settings, comma_list, setting
from lorafleet.process.settings_cli import settings_from_env
from lorafleet.proto.uris import is_scheme_name
from lorafleet.worker.lora.errors import LoraConfigError
from lorafleet.worker.lora.source import LoRASource

__all__ = ["DEFAULT_CACHE_DIR", "LoRAManagerConfig", "load_source"]

DEFAULT_CACHE_DIR: Final = Path("~/.cache/lorafleet/loras")
DEFAULT_DOWNLOAD_TIMEOUT_S: Final = 3600.0
_BYTES_MORE: Final = "In bytes, `_` allowed (`10_000_000`); `0`: no bound."


def _default_cache_dir() -> Path:
    return DEFAULT_CACHE_DIR.expanduser()


def _path(text: str) -> Path:
    return Path(text.strip()).expanduser()


def _paths(text: str) -> tuple[Path, ...]:
    return tuple(_path(part) for part in text.split(os.pathsep) if part.strip())


def _schemes(text: str) -> frozenset[str] | None:
    return frozenset(scheme.lower() for scheme in comma_list(text)) or None


def _sources(text: str) -> tuple[tuple[str, str], ...]:
    return tuple(_source(item) for item in comma_list(text))


def _source(item: str) -> tuple[str, str]:
    scheme, sep, spec = item.partition("=")
    module, colon, attr = spec.strip().partition(":")
    if not sep or not colon or not module or not attr:
        raise ValueError(f"entry {item!r} is not scheme=module:attr (e.g. hf=pkg.mod:Source)")
    return scheme.strip().lower(), spec.strip()


def _byte_count(text: str) -> int | None:
    value = text.strip().replace("_", "")
    if not value.isdigit():
        raise ValueError("must be a byte count, e.g. 10_000_000 (0: no bound)")
    return int(value) or None


def _absolute(roots: tuple[Path, ...]) -> str | None:
    return None if all(root.is_absolute() for root in roots) else "absolute paths"


def _scheme_names(schemes: Collection[str] | None) -> str | None:
    good = all(is_scheme_name(scheme) for scheme in schemes or ())
    return None if good else "scheme names (lower-case, e.g. 's3')"


def _source_schemes(sources: tuple[tuple[str, str], ...]) -> str | None:
    return _scheme_names([scheme for scheme, _ in sources])


def _positive_or_none(value: int | None) -> str | None:
    return "positive, or None for no bound" if value is not None and value <= 0 else None


@dataclass(frozen=True, kw_only=True)
class LoRAManagerConfig(Settings):
    """Where adapters are cached and which sources may be used.

    Examples::

        LoRAManagerConfig()                                   # ~/.cache/lorafleet/loras, any scheme
        LoRAManagerConfig(cache_dir=Path("/data/loras"), cache_max_bytes=20 << 30)
        LoRAManagerConfig(file_roots=(Path("/models"),), allowed_schemes=frozenset({"file"}))
    """

    cache_dir: Path = setting(
        factory=_default_cache_dir, env="DYN_LORA_PATH", parse=_path, shown=str(DEFAULT_CACHE_DIR),
        help="the adapter cache directory",
        more="Details: [`docs/lora-manager.md`](docs/lora-manager.md).",
    )  # fmt: skip
    file_roots: tuple[Path, ...] = setting(
        (), env="DYN_LORA_FILE_ROOTS", parse=_paths, check=_absolute,
        help="`file://` roots, `:`-separated like `PATH`; paths, and links inside an adapter "
        "directory, must resolve under one",
        more="Unset: anywhere.",
    )  # fmt: skip
    allowed_schemes: frozenset[str] | None = setting(
        None, env="DYN_LORA_ALLOWED_SCHEMES", parse=_schemes, check=_scheme_names,
        help="the URI schemes adapters may use, comma-separated, e.g. `file,s3`",
        more="Unset: every scheme that has a source.",
    )  # fmt: skip
    cache_max_bytes: int | None = setting(
        None, env="DYN_LORA_CACHE_MAX_BYTES", parse=_byte_count, check=_positive_or_none,
        help="the cache's size cap; above it the least recently used entries that no loaded "
        "adapter uses are evicted",
        more=_BYTES_MORE,
    )  # fmt: skip
    sources: tuple[tuple[str, str], ...] = setting(
        (), env="DYN_LORA_SOURCES", parse=_sources, check=_source_schemes,
        help="custom sources, `scheme=module:attr,...`, tried in this order",
        more="A class or zero-argument factory is called; an object is used as is.",
    )  # fmt: skip
    download_timeout_s: Annotated[float, POSITIVE] = setting(
        DEFAULT_DOWNLOAD_TIMEOUT_S, env="DYN_LORA_DOWNLOAD_TIMEOUT_S",
        help="seconds after which one source's whole download of one adapter fails (a source "
        "that hangs mid-download); a later load tries again",
    )  # fmt: skip
    max_adapter_bytes: int | None = setting(
        None, env="DYN_LORA_MAX_BYTES", parse=_byte_count, check=_positive_or_none,
        help="one adapter's size bound: checked from S3's listing and the hub's file listing "
        "(`hf://`) before any download, on S3's stream, on an archive's declared member sizes "
        "and on every chunk it expands to, on what any other source writes (every 0.1 s), "
        "and on `file://` adapters; over it the load is refused with 400, nothing stays in "
        "the cache, and placement does not retry it until the declared source changes",
        more=_BYTES_MORE,
    )  # fmt: skip
    allow_pickle: bool = setting(
        False, env=ALLOW_PICKLE_VARIABLE,
        help="load `adapter_model.bin` (a pickle, which can run code when loaded); off, only "
        "safetensors weights load, and a pickle is refused with 400 naming this variable",
    )  # fmt: skip

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ValueError as exc:
            raise LoraConfigError(str(exc)) from None
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
        """Read the ``DYN_LORA_*`` variables declared above (``os.environ`` unless given)."""
        try:
            return settings_from_env(cls, environ)
        except LoraConfigError:
            raise
        except ValueError as exc:
            raise LoraConfigError(str(exc)) from None


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
