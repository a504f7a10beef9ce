"""The s3:// source through the manager, against a real moto S3 server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lorafleet.worker.lora import (
    LoraInvalidAdapterError,
    LoRAManager,
    LoRAManagerConfig,
    LoraNotFoundError,
    LoraUnavailableError,
)
from lorafleet.worker.lora.s3_source import S3Source
from lorafleet.worker.lora.uri import cache_key
from tests.faults import TcpProxy
from tests.worker.lora.conftest import tar_gz


def _manager(tmp_path: Path) -> LoRAManager:
    return LoRAManager(config=LoRAManagerConfig(cache_dir=tmp_path / "cache"))


def _files_named(root: Path, name: str) -> list[Path]:
    return list(root.rglob(name))


def _cache_entries(tmp_path: Path) -> list[str]:
    root = tmp_path / "cache"
    return (
        sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
        if root.exists()
        else []
    )


async def test_download_fetches_both_files_then_serves_from_cache_without_requests(
    tmp_path: Path, aws_env: Any, upload: Callable[..., str], adapter_bytes: Callable[..., Any]
) -> None:
    uri = upload("adapters/pirate")
    manager = _manager(tmp_path)
    aws_env.reset_requests()

    path = await manager.download(uri)

    assert path == tmp_path / "cache" / cache_key(uri)
    for name, data in adapter_bytes().items():
        assert (path / name).read_bytes() == data
    assert aws_env.requests(), "the first download must reach S3"
    assert manager.is_cached(uri)
    aws_env.reset_requests()
    assert await manager.download(uri) == path
    assert await _manager(tmp_path).download(uri) == path  # a new process would reuse it too
    assert aws_env.requests() == []


async def test_twenty_concurrent_downloads_of_one_uri_make_one_set_of_requests(
    tmp_path: Path, aws_env: Any, upload: Callable[..., str]
) -> None:
    single_uri, shared_uri = upload("single"), upload("shared")
    aws_env.reset_requests()
    await _manager(tmp_path / "a").download(single_uri)
    one_set = len(aws_env.requests())
    manager = _manager(tmp_path)
    aws_env.reset_requests()

    paths = await asyncio.gather(*(manager.download(shared_uri) for _ in range(20)))

    assert len(set(paths)) == 1
    assert len(aws_env.requests()) == one_set
    assert _cache_entries(tmp_path) == [cache_key(shared_uri)]


async def test_prefix_without_adapter_config_is_refused_and_leaves_nothing_cached(
    tmp_path: Path, aws_env: Any, upload: Callable[..., str], adapter_bytes: Callable[..., Any]
) -> None:
    weights_only = {"adapter_model.safetensors": adapter_bytes()["adapter_model.safetensors"]}
    uri = upload("not-an-adapter", weights_only)
    manager = _manager(tmp_path)

    with pytest.raises(LoraInvalidAdapterError) as caught:
        await manager.download(uri)

    assert caught.value.code == "invalid_request"
    assert "adapter_config.json" in caught.value.message and uri in caught.value.message
    assert _cache_entries(tmp_path) == []
    assert list((tmp_path / "cache" / ".tmp").iterdir()) == []
    assert not manager.is_cached(uri)


async def test_missing_bucket_is_not_found_naming_the_uri(tmp_path: Path, aws_env: Any) -> None:
    uri = "s3://no-such-bucket-lorafleet/adapters/x"

    with pytest.raises(LoraNotFoundError) as caught:
        await _manager(tmp_path).download(uri)

    assert caught.value.code == "not_found"
    assert uri in caught.value.message and "bucket does not exist" in caught.value.message


async def test_missing_prefix_is_not_found(tmp_path: Path, aws_env: Any, bucket: Any) -> None:
    with pytest.raises(LoraNotFoundError, match="no objects under this prefix"):
        await _manager(tmp_path).download(f"s3://{bucket.name}/nothing/here")


async def test_wrong_credentials_give_a_clear_message_without_the_secret(
    tmp_path: Path,
    aws_env: Any,
    start_s3_server: Callable[..., Any],
    aws_secret: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    checking = start_s3_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    monkeypatch.setenv("AWS_ENDPOINT_URL", checking.endpoint)
    uri = "s3://private-loras/adapters/pirate"

    with pytest.raises(LoraUnavailableError) as caught:
        await _manager(tmp_path).download(uri)

    message = caught.value.message
    assert caught.value.code == "unavailable"
    assert uri in message and "refused the credentials (InvalidAccessKeyId" in message
    assert "AWS_SECRET_ACCESS_KEY" in message  # says what to check
    assert aws_secret not in message
    logged = capfd.readouterr()
    assert aws_secret not in logged.out + logged.err


async def test_object_key_escaping_the_prefix_is_refused_and_nothing_is_written(
    tmp_path: Path, aws_env: Any, upload: Callable[..., str], bucket: Any
) -> None:
    uri = upload("evil")
    bucket.put_object(Key="evil/../../escaped.txt", Body=b"outside")

    with pytest.raises(LoraInvalidAdapterError, match="outside the adapter directory"):
        await _manager(tmp_path).download(uri)

    assert _files_named(tmp_path, "escaped.txt") == []
    assert _cache_entries(tmp_path) == []


async def test_tar_archive_object_is_extracted_from_its_single_folder(
    tmp_path: Path, aws_env: Any, bucket: Any, adapter_bytes: Callable[..., Any]
) -> None:
    bucket.put_object(Key="archives/robot.tar.gz", Body=tar_gz(adapter_bytes()))
    uri = f"s3://{bucket.name}/archives/robot.tar.gz"

    path = await _manager(tmp_path).download(uri)

    assert path == tmp_path / "cache" / cache_key(uri)
    assert json.loads((path / "adapter_config.json").read_bytes())["peft_type"] == "LORA"


async def test_a_refresh_fetches_a_changed_archive_again_and_reuses_an_unchanged_one(
    tmp_path: Path, aws_env: Any, bucket: Any, adapter_bytes: Callable[..., Any]
) -> None:
    """The archive's ETag (one HEAD) tells whether the cached copy is still the object."""
    bucket.put_object(Key="archives/robot.tar.gz", Body=tar_gz(adapter_bytes()))
    uri = f"s3://{bucket.name}/archives/robot.tar.gz"
    manager = _manager(tmp_path)
    path = await manager.download(uri)
    weights = (path / "adapter_model.safetensors").read_bytes()
    aws_env.reset_requests()

    assert await manager.download(uri, refresh=True) == path
    assert [r.split(" ")[0] for r in aws_env.requests()] == ["HEAD"]  # asked, not fetched
    bucket.put_object(Key="archives/robot.tar.gz", Body=tar_gz(adapter_bytes(rank=2)))
    assert (await manager.download(uri)) == path  # a plain download keeps the cached copy
    assert (path / "adapter_model.safetensors").read_bytes() == weights

    assert await manager.download(uri, refresh=True) == path
    assert (path / "adapter_model.safetensors").read_bytes() == adapter_bytes(rank=2)[
        "adapter_model.safetensors"
    ]
    assert _cache_entries(tmp_path) == [cache_key(uri)]


PAUSING_DOWNLOADER = textwrap.dedent(
    """
    import asyncio, sys, time
    from lorafleet.worker.lora import LoRAManager
    from lorafleet.worker.lora.s3_source import default_s3_client

    def pausing_client():
        client = default_s3_client()
        gets = []
        def before_get(**_):
            gets.append(1)
            if len(gets) == 2:  # the first file is on disk, the second not yet
                print("PAUSED", flush=True)
                time.sleep(600)
        client.meta.events.register("before-send.s3.GetObject", before_get)
        return client

    manager = LoRAManager.from_env(s3_client_factory=pausing_client)
    asyncio.run(manager.download(sys.argv[1]))
    """
)


async def test_download_killed_half_way_leaves_no_valid_entry(
    tmp_path: Path, aws_env: Any, upload: Callable[..., str]
) -> None:
    uri = upload("killed")
    env = {**os.environ, "DYN_LORA_PATH": str(tmp_path / "cache")}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PAUSING_DOWNLOADER, uri, env=env, stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    assert await child.stdout.readline() == b"PAUSED\n"
    partial = [p for p in _files_named(tmp_path / "cache" / ".tmp", "*") if p.is_file()]
    child.send_signal(signal.SIGKILL)
    await child.wait()

    manager = _manager(tmp_path)
    assert partial, "the child had written part of the adapter"
    assert not manager.is_cached(uri)
    assert _cache_entries(tmp_path) == []
    path = await manager.download(uri)
    assert manager.is_cached(uri) and path.name == cache_key(uri)
    assert list((tmp_path / "cache" / ".tmp").iterdir()) == []  # the dead child's leftovers


async def test_exists_answers_without_downloading(
    tmp_path: Path, aws_env: Any, upload: Callable[..., str], bucket: Any
) -> None:
    uri = upload("present")
    source = S3Source()
    aws_env.reset_requests()

    assert await source.exists(uri)
    assert not await source.exists(f"s3://{bucket.name}/absent")
    assert not await source.exists("s3://no-such-bucket-lorafleet/x")
    assert all(
        request.startswith("GET") and "list-type=2" in request for request in aws_env.requests()
    )


async def test_an_adapter_listed_over_the_size_bound_is_refused_before_any_get(
    tmp_path: Path, aws_env: Any, upload: Callable[..., str], adapter_bytes: Callable[..., Any]
) -> None:
    uri = upload("adapters/bounded")
    listed = sum(len(data) for data in adapter_bytes().values())
    config = LoRAManagerConfig(cache_dir=tmp_path / "cache", max_adapter_bytes=listed - 1)
    aws_env.reset_requests()

    with pytest.raises(LoraInvalidAdapterError, match="DYN_LORA_MAX_BYTES") as refused:
        await LoRAManager(config=config).download(uri)

    assert f"{listed} > {listed - 1}" in str(refused.value)
    assert not [r for r in aws_env.requests() if r.startswith("GET") and "list-type" not in r]
    assert _cache_entries(tmp_path) == []


async def test_s3_hanging_mid_download_times_out_naming_the_source_and_a_retry_works(
    tmp_path: Path, aws_env: Any, upload: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TCP proxy before moto lets the listing and the config through, then holds every
    byte once the weights are asked for: the server is up, the download just hangs."""
    uri = upload("hangs")
    proxy = await TcpProxy(int(aws_env.endpoint.rsplit(":", 1)[1])).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("DYN_LORA_DOWNLOAD_TIMEOUT_S", "2")
    monkeypatch.setenv("DYN_LORA_PATH", str(tmp_path / "cache"))
    manager = LoRAManager.from_env()
    try:
        proxy.stall_when_sent(b"adapter_model.safetensors")
        with pytest.raises(LoraUnavailableError, match=r"source s3 timed out after 2\.0 s") as err:
            await manager.download(uri)
        assert proxy.was_stalled.is_set() and uri in str(err.value)
        assert list((tmp_path / "cache" / ".tmp").iterdir()) == []  # the partial files went
        assert _cache_entries(tmp_path) == []
        proxy.restore()
        path = await manager.download(uri)  # the slot was freed: a new download, not the hung one
        assert manager.is_cached(uri) and path.name == cache_key(uri)
    finally:
        await proxy.aclose()  # ends the hung request in its thread (connection reset)
        await manager.aclose()


def _tar_with(adapter: dict[str, bytes], odd: tarfile.TarInfo) -> bytes:
    """A gzip tar of ``adapter``'s files and one odd member (a link, a device, a FIFO)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in adapter.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.addfile(odd)
    return buffer.getvalue()


def _odd_member(kind: str) -> tarfile.TarInfo:
    member = tarfile.TarInfo("new_embeddings.safetensors")
    member.type, member.linkname = {
        "symlink": (tarfile.SYMTYPE, "/etc/passwd"),
        "hard link": (tarfile.LNKTYPE, "adapter_config.json"),
        "device": (tarfile.CHRTYPE, ""),
        "fifo": (tarfile.FIFOTYPE, ""),
    }[kind]
    return member


@pytest.mark.parametrize("kind", ["symlink", "hard link", "device", "fifo"])
async def test_an_archive_object_with_a_link_or_special_member_is_refused_and_nothing_cached(
    tmp_path: Path, aws_env: Any, bucket: Any, adapter_bytes: Callable[..., Any], kind: str
) -> None:
    bucket.put_object(Key="odd/adapter.tar.gz", Body=_tar_with(adapter_bytes(), _odd_member(kind)))
    manager = _manager(tmp_path)
    uri = f"s3://{bucket.name}/odd/adapter.tar.gz"

    with pytest.raises(LoraInvalidAdapterError, match="link or special file") as refused:
        await manager.download(uri)

    assert refused.value.code == "invalid_request"
    assert "new_embeddings.safetensors" in str(refused.value)
    assert _cache_entries(tmp_path) == [] and not manager.is_cached(uri)
    assert [p for p in _files_named(tmp_path / "cache", "*") if not p.is_dir()] == []


async def test_a_zip_object_with_a_member_outside_the_adapter_folder_is_refused(
    tmp_path: Path, aws_env: Any, bucket: Any, adapter_bytes: Callable[..., Any]
) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        for name, data in adapter_bytes().items():
            zipped.writestr(name, data)
        zipped.writestr("../../escaped.txt", b"outside")
    bucket.put_object(Key="odd/adapter.zip", Body=buffer.getvalue())
    manager = _manager(tmp_path)
    uri = f"s3://{bucket.name}/odd/adapter.zip"

    with pytest.raises(LoraInvalidAdapterError, match="outside the adapter directory") as refused:
        await manager.download(uri)

    assert refused.value.code == "invalid_request"
    assert _cache_entries(tmp_path) == [] and not manager.is_cached(uri)
    assert _files_named(tmp_path, "escaped.txt") == []
