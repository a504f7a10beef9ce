"""Adapter directories for tests: PEFT-shaped files for engines that read no weights."""

from __future__ import annotations

import json
from pathlib import Path


def make_adapter_dir(root: Path, name: str, base_model: str = "demo") -> Path:
    """Write ``adapter_config.json`` and a placeholder ``adapter_model.safetensors``.

    The mocker engine reads no weights, so the tensor file only has to exist
    for the LoRA manager's validation; real adapters come from the demo model.
    """
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    config = {"base_model_name_or_path": base_model, "peft_type": "LORA", "r": 8}
    (path / "adapter_config.json").write_text(json.dumps(config))
    (path / "adapter_model.safetensors").write_bytes(b"\x00" * 16)
    return path
