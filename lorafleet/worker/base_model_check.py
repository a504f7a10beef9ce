"""Whether an adapter was trained for the base model this worker serves, checked before the
engine reads a byte of it.

An adapter's ``adapter_config.json`` names its base model (``base_model_name_or_path``). The
worker is known by several names: the served name, the model path, the hub id its
``config.json`` records (``_name_or_path``) and the operator's aliases
(``DYN_LORA_BASE_MODEL_ALIASES``). Names rarely match exactly (a local path against a hub id),
so two names match when equal, or when their last path segments are equal ignoring case
(``/models/Llama-3-8B`` and ``meta-llama/llama-3-8b``). ``DYN_LORA_BASE_MODEL_CHECK`` says
what a mismatch does: ``strict`` refuses the load (400), ``warn`` loads it with a warning in
the answer and the log, ``off`` does not look.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from lorafleet.fleet.adapter_files import read_adapter_config
from lorafleet.proto.errors import InvalidRequestError

__all__ = ["BaseModelCheck", "BaseModelPolicy", "hub_id"]

log = structlog.get_logger(__name__)

MODEL_CONFIG: Final = "config.json"
MODEL_CONFIG_MAX_BYTES: Final = 1 << 20
BASE_MODEL_KEY: Final = "base_model_name_or_path"


class BaseModelCheck(enum.Enum):
    """What a load does with an adapter trained for another base model."""

    STRICT = "strict"
    """Refuse it (400)."""
    WARN = "warn"
    """Load it; say so in the load's answer and the log."""
    OFF = "off"
    """Do not compare."""


def hub_id(model: str) -> str | None:
    """The ``_name_or_path`` that the model directory's ``config.json`` records, if any."""
    config = Path(model) / MODEL_CONFIG
    try:
        if not config.is_file() or config.stat().st_size > MODEL_CONFIG_MAX_BYTES:
            return None
        parsed = json.loads(config.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    name = parsed.get("_name_or_path") if isinstance(parsed, dict) else None
    return name if isinstance(name, str) and name.strip() else None


def _tail(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1].casefold()


@dataclass(frozen=True)
class BaseModelPolicy:
    """The names this worker's base model goes by, and what a mismatch does.

    Example::

        policy = BaseModelPolicy.of(BaseModelCheck.WARN, ["demo", "/models/demo"], aliases=())
        warnings = policy.check("pirate", Path("/cache/s3_ab12"))  # [] or one warning
    """

    mode: BaseModelCheck
    served: tuple[str, ...]
    """Served name, model path, hub id and aliases, without duplicates."""

    @classmethod
    def of(cls, mode: BaseModelCheck, names: Iterable[str | None]) -> BaseModelPolicy:
        """A policy for the base model known by ``names`` (None and blanks are skipped)."""
        served = tuple(dict.fromkeys(n.strip() for n in names if n is not None and n.strip()))
        return cls(mode=mode, served=served)

    @property
    def shown(self) -> tuple[str, ...]:
        """The names a message may show: not the model's path on the worker's disk (the
        frontends show load warnings to anyone)."""
        names = tuple(name for name in self.served if not name.startswith(("/", "~", ".")))
        return names or self.served[:1]

    def matches(self, trained_for: str) -> bool:
        """Whether ``trained_for`` names this worker's base model (leniently)."""
        return any(trained_for == name or _tail(trained_for) == _tail(name)
                   for name in self.served)  # fmt: skip

    def check(self, adapter: str, path: Path) -> list[str]:
        """The warnings for loading ``adapter`` from ``path``; ``InvalidRequestError`` when
        the policy is ``strict`` and it was trained for another base model."""
        if self.mode is BaseModelCheck.OFF:
            return []
        try:
            trained_for = read_adapter_config(path).get(BASE_MODEL_KEY)
        except (OSError, ValueError):
            return []  # the adapter check upstream already refused an unreadable config
        if not isinstance(trained_for, str) or not trained_for.strip() or self.matches(trained_for):
            return []
        problem = (
            f"adapter {adapter!r} was trained for base model {trained_for!r}; this worker "
            f"serves {' / '.join(repr(name) for name in self.shown)}"
        )
        if self.mode is BaseModelCheck.STRICT:
            raise InvalidRequestError(
                f"{problem}; load it on a worker of that model, or add {trained_for!r} to "
                "DYN_LORA_BASE_MODEL_ALIASES if it is the same model",
                lora_name=adapter,
            )
        log.warning("adapter trained for another base model; loading it (warn)",
                    adapter=adapter, trained_for=trained_for, served=list(self.served))  # fmt: skip
        return [f"{problem} (DYN_LORA_BASE_MODEL_CHECK=warn: loaded anyway)"]
