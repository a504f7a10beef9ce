"""A full disk under the adapter cache (issue 27, case 6): a small tmpfs is the cache.

Needs root to mount the tmpfs; skipped elsewhere. S3 is a real moto server.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lorafleet.worker.lora import LoRAManager, LoRAManagerConfig, LoraUnavailableError
from tests.worker.lora.conftest import adapter_files

SMALL_FS = "size=64k"
"""Room for a small adapter (about 1 KiB of weights), not for a large one (512 KiB)."""


def _mount(path: Path, options: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted for this test, unmounted after it."""
    path = tmp_path / "cache"
    path.mkdir()
    if os.geteuid() != 0 or _mount(path, SMALL_FS).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


async def test_a_full_cache_disk_fails_the_load_clearly_and_keeps_what_is_loaded(
    small_disk: Path, aws_env: Any, upload: Callable[..., str]
) -> None:
    small = upload("small", adapter_files(rank=4))
    large = upload("large", adapter_files(rank=2048))
    manager = LoRAManager(config=LoRAManagerConfig(cache_dir=small_disk))
    try:
        loaded = await manager.acquire(small)  # a loaded adapter: its entry is in use
        before = {p.name: p.read_bytes() for p in loaded.iterdir()}
        with pytest.raises(LoraUnavailableError, match="No space left on device") as err:
            await manager.download(large)
        assert large in str(err.value) and str(small_disk) in str(err.value)
        assert list((small_disk / ".tmp").iterdir()) == []  # the partial files went
        assert {p.name: p.read_bytes() for p in loaded.iterdir()} == before
        assert manager.is_cached(small) and not manager.is_cached(large)

        remount = _mount(small_disk, "remount,size=4m")  # space returns
        assert remount.returncode == 0, remount.stderr
        assert (await manager.download(large)).is_dir()
        assert manager.is_cached(large)
    finally:
        manager.release(small)
        await manager.aclose()
