"""An adapter's content digest changes with its weights and config, and with nothing else."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from lorafleet.worker import version_steps
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


def test_a_folder_without_its_config_or_weights_has_no_digest(tmp_path: Path) -> None:
    """A digest of nothing named no version: a folder caught between another worker's swap of
    a shared cache entry read as ``sha256:e3b0…``, the digest of no bytes at all."""
    with pytest.raises(FileNotFoundError, match=r"adapter_config\.json"):
        content_digest(tmp_path / "gone")
    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    (weights_only / "adapter_model.safetensors").write_bytes(b"weights")
    with pytest.raises(FileNotFoundError, match=r"adapter_config\.json"):
        content_digest(weights_only)
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "adapter_config.json").write_bytes(b"{}")
    with pytest.raises(FileNotFoundError, match=r"adapter_model\.safetensors"):
        content_digest(config_only)


def test_an_entry_swapped_by_a_sharing_worker_mid_read_is_read_again_after_the_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry is missing when first read (renamed away by the other worker); the wait
    before the next read is when that worker renames its new copy in."""
    entry = tmp_path / "cache" / "s3_entry"
    entry.parent.mkdir()
    new_copy = _adapter(tmp_path / "new", b"new weights")
    waits: list[float] = []

    def the_swap_completes(seconds: float) -> None:
        waits.append(seconds)
        new_copy.rename(entry)

    monkeypatch.setattr(version_steps.time, "sleep", the_swap_completes)
    digest = version_steps._settled_digest(entry)
    assert waits == [version_steps.DIGEST_RETRY_S]
    assert digest == content_digest(entry)
    assert digest != "sha256:" + hashlib.sha256().hexdigest()
