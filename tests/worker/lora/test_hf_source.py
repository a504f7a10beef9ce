"""The hf:// source checks the hub's file listing before it fetches a byte.

No Hugging Face Hub is reachable from the test machines (there is no internet here): a local
stand-in (``hub_stand_in.py``) serves the few endpoints huggingface_hub calls, through
``HF_ENDPOINT``, lists each file's size as the hub does, and records every request.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lorafleet.worker.lora import LoraInvalidAdapterError, LoRAManager, LoRAManagerConfig
from tests.worker.lora.hub_stand_in import HubRepo, serve_hub

URI = "hf://org/pirate-lora@v1"


def _manager(tmp_path: Path, max_adapter_bytes: int | None = None) -> LoRAManager:
    config = LoRAManagerConfig(cache_dir=tmp_path / "cache", max_adapter_bytes=max_adapter_bytes)
    return LoRAManager(config=config)


def _cached_files(tmp_path: Path) -> list[Path]:
    """Files anywhere under the cache (entries and private downloads alike)."""
    return [path for path in (tmp_path / "cache").rglob("*") if path.is_file()]


def _files_named(root: Path, name: str) -> list[Path]:
    return list(root.rglob(name))


def _fetched(repo: HubRepo) -> list[str]:
    """The requests for a file's bytes (listings are ``/api/...``)."""
    return [request for request in repo.requests if "/resolve/" in request]


async def test_an_adapter_listed_over_the_size_bound_is_refused_before_any_file_is_fetched(
    tmp_path: Path, adapter_bytes: Callable[..., dict[str, bytes]]
) -> None:
    repo = HubRepo("org/pirate-lora", adapter_bytes(), revision="v1")
    listed = sum(len(data) for data in repo.files.values())

    with serve_hub(repo) as endpoint, pytest.MonkeyPatch.context() as env:
        env.setenv("HF_ENDPOINT", endpoint)
        with pytest.raises(LoraInvalidAdapterError, match="DYN_LORA_MAX_BYTES") as refused:
            await _manager(tmp_path, max_adapter_bytes=listed - 1).download(URI)
        fetched_when_refused = _fetched(repo)
        assert _cached_files(tmp_path) == []
        # exactly the adapter's size: huggingface_hub's own files in the download are not
        # counted while it runs
        within = await _manager(tmp_path, max_adapter_bytes=listed).download(URI)

    assert f"{listed} > {listed - 1}" in str(refused.value)
    assert refused.value.code == "invalid_request"  # 400: the adapter, not the hub, is wrong
    assert fetched_when_refused == []
    assert {p.name: p.read_bytes() for p in within.iterdir()} == repo.files


async def test_a_hub_file_named_outside_the_adapter_folder_is_refused_before_any_download(
    tmp_path: Path, adapter_bytes: Callable[..., dict[str, bytes]]
) -> None:
    repo = HubRepo("org/pirate-lora", {**adapter_bytes(), "../../escaped.txt": b"x"}, revision="v1")

    with serve_hub(repo) as endpoint, pytest.MonkeyPatch.context() as env:
        env.setenv("HF_ENDPOINT", endpoint)
        manager = _manager(tmp_path)
        with pytest.raises(LoraInvalidAdapterError, match="outside the adapter directory") as bad:
            await manager.download(URI)

    assert bad.value.code == "invalid_request"
    assert "../../escaped.txt" in str(bad.value)
    assert _fetched(repo) == []
    assert _cached_files(tmp_path) == [] and not manager.is_cached(URI)
    assert _files_named(tmp_path, "escaped.txt") == []
