"""An archive that expands far past DYN_LORA_MAX_BYTES, fetched from a real moto S3 server.

The load runs in a child process, as in a worker: when the child has exited, every thread
it started has ended, so what is on disk then is what the refused load left for good.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import textwrap
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lorafleet.worker.lora.s3_source import S3Source, default_s3_client
from tests.worker.lora.conftest import tar_gz

BOUND_BYTES = 8 << 20
MEMBER_BYTES = 8 << 20
MEMBERS = 8
"""Eight members of 8 MiB of zeros: 64 MiB on disk from an archive of about 70 KB."""
THREAD_WAIT_S = 60.0

BOMB_LOADER = textwrap.dedent(
    """
    import asyncio, sys
    from lorafleet.worker.lora import LoRAManager, LoraSourceError

    async def main():
        try:
            await LoRAManager.from_env().download(sys.argv[1])
        except LoraSourceError as exc:
            print(exc.code, exc.message, flush=True)

    asyncio.run(main())
    """
)


def _tar_gz_bomb(adapter: dict[str, bytes]) -> bytes:
    return tar_gz(adapter | {f"zeros-{n}.bin": bytes(MEMBER_BYTES) for n in range(MEMBERS)})


def _zip_bomb(adapter: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
        for name, data in adapter.items():
            zipped.writestr(name, data)
        for n in range(MEMBERS):
            zipped.writestr(f"zeros-{n}.bin", bytes(MEMBER_BYTES))
    return buffer.getvalue()


def _disk_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root`` now (files vanishing meanwhile count 0)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue
    return total


class DiskPeak:
    """Measures the bytes under a folder over and over in a thread, keeping the largest."""

    def __init__(self, root: Path) -> None:
        self.root, self.peak = root, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._measure, daemon=True)

    def _measure(self) -> None:
        while not self._done.wait(0.002):
            self.peak = max(self.peak, _disk_bytes(self.root))

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()


@pytest.mark.parametrize(("key", "build"), [("bomb.tar.gz", _tar_gz_bomb), ("bomb.zip", _zip_bomb)])
async def test_an_archive_bomb_from_s3_stops_at_the_bound_and_leaves_nothing_on_disk(
    tmp_path: Path,
    aws_env: Any,
    bucket: Any,
    adapter_bytes: Callable[..., Any],
    key: str,
    build: Callable[[dict[str, bytes]], bytes],
) -> None:
    bomb = build(adapter_bytes())
    bucket.put_object(Key=f"archives/{key}", Body=bomb)
    cache = tmp_path / "cache"
    env = {**os.environ, "DYN_LORA_PATH": str(cache), "DYN_LORA_MAX_BYTES": str(BOUND_BYTES)}
    uri = f"s3://{bucket.name}/archives/{key}"

    with DiskPeak(cache) as disk:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", BOMB_LOADER, uri, env=env, stdout=subprocess.PIPE
        )
        output, _ = await child.communicate()
    answer = output.decode().splitlines()[-1]  # the last line; the log goes to stdout too

    assert len(bomb) < 1 << 20 < MEMBERS * MEMBER_BYTES
    assert answer.startswith("invalid_request ")  # 400 in proto.errors' table
    assert "larger than DYN_LORA_MAX_BYTES" in answer
    assert disk.peak <= BOUND_BYTES + len(bomb), f"{disk.peak} bytes on disk during the load"
    assert _disk_bytes(cache) == 0, "the refused load left files behind"
    assert list((cache / ".tmp").iterdir()) == []


async def test_a_cancelled_s3_download_stops_in_its_thread_and_removes_what_it_wrote(
    tmp_path: Path, aws_env: Any, bucket: Any, adapter_bytes: Callable[..., Any]
) -> None:
    """A timeout cancels the download's task, but not its thread: held at its GET while the
    task is cancelled, then let go, the thread must stop and leave no file behind."""
    bucket.put_object(Key="archives/held.tar.gz", Body=_tar_gz_bomb(adapter_bytes()))
    at_get, go_on = threading.Event(), threading.Event()

    def holding_client() -> Any:
        client = default_s3_client()

        def hold(**_: Any) -> None:
            at_get.set()
            go_on.wait(THREAD_WAIT_S)

        client.meta.events.register("before-send.s3.GetObject", hold)
        return client

    dest = tmp_path / "dest"
    dest.mkdir()
    source = S3Source(client_factory=holding_client)
    download = asyncio.ensure_future(
        source.download(f"s3://{bucket.name}/archives/held.tar.gz", dest)
    )
    assert await asyncio.to_thread(at_get.wait, THREAD_WAIT_S)
    download.cancel()
    with pytest.raises(asyncio.CancelledError):
        await download
    go_on.set()

    async with asyncio.timeout(THREAD_WAIT_S):
        while dest.exists():  # the thread removes it once it sees the cancellation
            await asyncio.sleep(0.01)
