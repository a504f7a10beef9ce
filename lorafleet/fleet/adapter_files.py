"""Checks that a directory holds a usable PEFT adapter, cheaply and without torch.

A directory passes when ``adapter_config.json`` is a JSON object naming a base
model or a PEFT type, and a non-empty ``adapter_model.safetensors`` or
``adapter_model.bin`` is present. ``adapter_model.safetensors`` must be one by its
bytes, whatever its name says (``fleet.safetensors_file``): a header the file holds
whole, whose tensors' offsets tile the file exactly; the tensors themselves are the
engine's business. The check reads the header only. This is the one reader of
``adapter_config.json``: the engines' rank check (:func:`check_adapter_rank`) reads it
here too.

``adapter_model.bin`` is a pickle, which runs code when it is loaded: it passes
:func:`adapter_problem` (the file is usable) but :func:`pickle_problem` refuses it
unless the operator allows pickles (``DYN_LORA_ALLOW_PICKLE``).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any, Final

from lorafleet.fleet.safetensors_file import safetensors_problem
from lorafleet.proto.errors import AdapterRankError, InvalidRequestError

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "ALLOW_PICKLE_VARIABLE",
    "adapter_bytes",
    "adapter_problem",
    "check_adapter_rank",
    "lora_rank",
    "pickle_problem",
    "read_adapter_config",
]

ADAPTER_CONFIG: Final = "adapter_config.json"
ADAPTER_WEIGHTS: Final = ("adapter_model.safetensors", "adapter_model.bin")
CONFIG_MAX_BYTES: Final = 1 << 20
_CONFIG_NAMES: Final = ("base_model_name_or_path", "peft_type")
ALLOW_PICKLE_VARIABLE: Final = "DYN_LORA_ALLOW_PICKLE"


def adapter_problem(path: Path) -> str | None:
    """Return why ``path`` is not a usable adapter directory, or None when it is."""
    if not path.is_dir():
        return "not a directory"
    problem = _config_problem(path)
    if problem is not None:
        return problem
    for weights in (path / name for name in ADAPTER_WEIGHTS):
        if weights.is_file():
            if weights.stat().st_size == 0:
                return f"{weights.name} is empty"
            return safetensors_problem(weights) if weights.suffix == ".safetensors" else None
    return f"neither {' nor '.join(ADAPTER_WEIGHTS)} is present"


def pickle_problem(path: Path) -> str | None:
    """Return why ``path``'s weights would be unpickled, or None when they are safetensors."""
    safe, pickled = (path / name for name in ADAPTER_WEIGHTS)
    if safe.is_file() or not pickled.is_file():
        return None
    return (
        f"its weights are {pickled.name}, a pickle, which can run code when loaded; convert it "
        f"to safetensors, or set {ALLOW_PICKLE_VARIABLE}=true on the worker to allow pickles"
    )


def adapter_bytes(path: Path, skip: Collection[str] = ()) -> int:
    """Bytes of the files under ``path`` (an adapter directory, or one being downloaded),
    leaving out its top-level entries named in ``skip`` (a source's own bookkeeping)."""
    return sum(
        member.stat().st_size
        for member in path.rglob("*")
        if member.is_file() and member.relative_to(path).parts[0] not in skip
    )


def read_adapter_config(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``'s ``adapter_config.json``; ``ValueError`` says what is wrong."""
    config = path / ADAPTER_CONFIG
    if not config.is_file():
        raise ValueError(f"{ADAPTER_CONFIG} is missing")
    if config.stat().st_size > CONFIG_MAX_BYTES:
        raise ValueError(f"{ADAPTER_CONFIG} is larger than {CONFIG_MAX_BYTES} bytes")
    try:
        parsed = json.loads(config.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{ADAPTER_CONFIG} is not valid JSON ({type(exc).__name__})") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"{ADAPTER_CONFIG} is not a JSON object")
    return parsed


def check_adapter_rank(name: str, path: Path, max_rank: int) -> None:
    """Refuse, before an engine loads it, a directory that holds no LoRA of rank <= ``max_rank``
    (``AdapterRankError`` when only its rank is too large)."""
    try:
        config = read_adapter_config(path)
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"adapter {name!r} at {path} is not usable: {exc}") from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise InvalidRequestError(f"adapter {name!r}: {path} is not a LoRA adapter")
    biggest = lora_rank(config)
    if biggest > max_rank:
        raise AdapterRankError(
            f"adapter {name!r} at {path} has rank {biggest}; this engine takes at most "
            f"{max_rank} (max_lora_rank)"
        )


def lora_rank(config: dict[str, Any]) -> int:
    """The largest LoRA rank an ``adapter_config.json`` declares (``r`` and ``rank_pattern``;
    0 when it declares none)."""
    pattern = config.get("rank_pattern")
    ranks = [config.get("r"), *(pattern.values() if isinstance(pattern, dict) else ())]
    return max((r for r in ranks if isinstance(r, int) and not isinstance(r, bool)), default=0)


def _config_problem(path: Path) -> str | None:
    try:
        parsed = read_adapter_config(path)
    except ValueError as exc:
        return str(exc)
    if not any(isinstance(parsed.get(name), str) and parsed[name] for name in _CONFIG_NAMES):
        return f"{ADAPTER_CONFIG} names neither {' nor '.join(_CONFIG_NAMES)}"
    return None
