"""Checks that a directory holds a usable PEFT adapter, cheaply and without torch.

A directory passes when ``adapter_config.json`` is a JSON object naming a base
model or a PEFT type, and ``adapter_model.safetensors`` (complete: its header
parses and the file is as long as the header says) or a non-empty
``adapter_model.bin`` is present. The check reads a few kilobytes at most.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Final

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "adapter_problem"]

ADAPTER_CONFIG: Final = "adapter_config.json"
ADAPTER_WEIGHTS: Final = ("adapter_model.safetensors", "adapter_model.bin")
CONFIG_MAX_BYTES: Final = 1 << 20
SAFETENSORS_HEADER_MAX_BYTES: Final = 100 << 20
_CONFIG_NAMES: Final = ("base_model_name_or_path", "peft_type")


def adapter_problem(path: Path) -> str | None:
    """Return why ``path`` is not a usable adapter directory, or None when it is."""
    if not path.is_dir():
        return "not a directory"
    problem = _config_problem(path / ADAPTER_CONFIG)
    if problem is not None:
        return problem
    safetensors, bin_file = (path / name for name in ADAPTER_WEIGHTS)
    if safetensors.is_file():
        return _safetensors_problem(safetensors)
    if bin_file.is_file():
        return None if bin_file.stat().st_size > 0 else f"{bin_file.name} is empty"
    return f"neither {' nor '.join(ADAPTER_WEIGHTS)} is present"


def _config_problem(config: Path) -> str | None:
    if not config.is_file():
        return f"{ADAPTER_CONFIG} is missing"
    if config.stat().st_size > CONFIG_MAX_BYTES:
        return f"{ADAPTER_CONFIG} is larger than {CONFIG_MAX_BYTES} bytes"
    try:
        parsed = json.loads(config.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        return f"{ADAPTER_CONFIG} is not valid JSON ({type(exc).__name__})"
    if not isinstance(parsed, dict):
        return f"{ADAPTER_CONFIG} is not a JSON object"
    if not any(isinstance(parsed.get(name), str) and parsed[name] for name in _CONFIG_NAMES):
        return f"{ADAPTER_CONFIG} names neither {' nor '.join(_CONFIG_NAMES)}"
    return None


def _safetensors_problem(weights: Path) -> str | None:
    size = weights.stat().st_size
    with weights.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            return f"{weights.name} is truncated (no header)"
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(SAFETENSORS_HEADER_MAX_BYTES, size - 8):
            return f"{weights.name} is truncated or corrupt (header length {header_len})"
        try:
            header = json.loads(handle.read(header_len))
        except (ValueError, UnicodeDecodeError):
            return f"{weights.name} has a header that is not JSON"
    if not isinstance(header, dict):
        return f"{weights.name} has a header that is not a JSON object"
    try:
        data_end = max(
            (int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
            default=0,
        )
    except (KeyError, TypeError, ValueError, IndexError):
        return f"{weights.name} has a malformed header"
    if size < 8 + header_len + data_end:
        return f"{weights.name} is truncated ({size} of {8 + header_len + data_end} bytes)"
    return None
