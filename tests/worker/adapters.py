"""Adapter directories for tests: PEFT-shaped files for engines that read no weights."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path

from bench._cluster import placeholder_weights
from lorafleet.worker.lora.digest import content_digest


def make_adapter_dir(
    root: Path, name: str, base_model: str = "demo", weights: bytes = b"\x00" * 16, rank: int = 8
) -> Path:
    """Write ``adapter_config.json`` and a placeholder ``adapter_model.safetensors``.

    The mocker engine reads no weights, so the tensor file only has to be a
    safetensors file for the LoRA manager's validation; real adapters come from
    the demo model. Other ``weights`` (the one tensor's bytes) make another
    version (another content digest); ``rank`` is the LoRA rank its config declares
    (engines refuse one above their ``--max-lora-rank``).
    """
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    config = {"base_model_name_or_path": base_model, "peft_type": "LORA", "r": rank}
    (path / "adapter_config.json").write_text(json.dumps(config))
    (path / "adapter_model.safetensors").write_bytes(placeholder_weights(weights))
    return path


def adapter_digest(base_model: str = "demo", weights: bytes = b"\x00" * 16) -> str:
    """The content digest of the directory ``make_adapter_dir`` writes for these arguments."""
    with tempfile.TemporaryDirectory() as root:
        return content_digest(make_adapter_dir(Path(root), "any", base_model, weights))


WEIGHTS = "adapter_model.safetensors"


def lying_adapters(root: Path) -> dict[Path, str]:
    """Adapter folders whose weights are no whole safetensors file, each with what is wrong."""
    huge_header = make_adapter_dir(root, "huge-header")
    (huge_header / WEIGHTS).write_bytes(struct.pack("<Q", 1 << 40) + b"{}")  # 10 bytes
    huge_tensor = make_adapter_dir(root, "huge-tensor")
    tensor = {"dtype": "U8", "shape": [1 << 40], "data_offsets": [0, 1 << 40]}
    header = json.dumps({"lora_A.weight": tensor}).encode()
    (huge_tensor / WEIGHTS).write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    passwd = make_adapter_dir(root, "passwd")
    (passwd / WEIGHTS).unlink()
    (passwd / WEIGHTS).symlink_to("/etc/passwd")
    return {
        huge_header: f"{WEIGHTS} is not a safetensors file (its first 8 bytes declare a header",
        huge_tensor: f"{WEIGHTS} is truncated, or its header lies",
        passwd: f"{WEIGHTS} is not a safetensors file",
    }
