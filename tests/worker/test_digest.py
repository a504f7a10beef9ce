"""An adapter's content digest changes with its weights and config, and with nothing else."""

from __future__ import annotations

from pathlib import Path

from lorafleet.worker.lora.digest import content_digest


def _adapter(root: Path, weights: bytes, config: bytes = b'{"peft_type": "LORA"}') -> Path:
    root.mkdir()
    (root / "adapter_config.json").write_bytes(config)
    (root / "adapter_model.safetensors").write_bytes(weights)
    return root


def test_the_same_files_give_the_same_digest_wherever_they_live(tmp_path: Path) -> None:
    first = _adapter(tmp_path / "a", b"weights")
    second = _adapter(tmp_path / "b", b"weights")
    (second / "README.md").write_text("not read by any engine")
    assert content_digest(first) == content_digest(second)
    assert content_digest(first).startswith("sha256:")


def test_changed_weights_or_config_change_the_digest(tmp_path: Path) -> None:
    base = content_digest(_adapter(tmp_path / "a", b"weights"))
    assert content_digest(_adapter(tmp_path / "b", b"weightz")) != base
    assert content_digest(_adapter(tmp_path / "c", b"weights", b'{"r": 8}')) != base


def test_bytes_moved_between_files_change_the_digest(tmp_path: Path) -> None:
    first = _adapter(tmp_path / "a", b"}xyz", config=b"{")
    second = _adapter(tmp_path / "b", b"xyz", config=b"{}")
    assert content_digest(first) != content_digest(second)
