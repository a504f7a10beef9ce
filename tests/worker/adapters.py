"""Adapter directories for tests: PEFT-shaped files for engines that read no weights."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from lorafleet.worker.lora.digest import content_digest


def make_adapter_dir(
    root: Path, name: str, base_model: str = "demo", weights: bytes = b"\x00" * 16, rank: int = 8
) -> Path:
    """Write ``adapter_config.json`` and a placeholder ``adapter_model.safetensors``.

    The mocker engine reads no weights, so the tensor file only has to exist
    for the LoRA manager's validation; real adapters come from the demo model.
    Other ``weights`` make another version (another content digest); ``rank`` is the LoRA
    rank its config declares (engines refuse one above their ``--max-lora-rank``).
    """
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    config = {"base_model_name_or_path": base_model, "peft_type": "LORA", "r": rank}
    (path / "adapter_config.json").write_text(json.dumps(config))
    (path / "adapter_model.safetensors").write_bytes(weights)
    return path


def adapter_digest(base_model: str = "demo", weights: bytes = b"\x00" * 16) -> str:
    """The content digest of the directory ``make_adapter_dir`` writes for these arguments."""
    with tempfile.TemporaryDirectory() as root:
        return content_digest(make_adapter_dir(Path(root), "any", base_model, weights))
