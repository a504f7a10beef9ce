"""Dynamo's LoRA manager API beside ours: LoRAManager(), download_lora, custom sources,
AWS_ENDPOINT/AWS_ALLOW_HTTP (against moto) and hf:// (against a local hub stand-in)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lorafleet.worker.lora import LoraConfigError, LoRAManager
from tests.worker.lora.hub_stand_in import HubRepo, serve_hub


class DownloadOnlySource:
    """Dynamo's minimal custom source: an async ``download`` and nothing else."""

    def __init__(self, store: Path) -> None:
        self.store = store

    async def download(self, lora_uri: str, dest_path: Path) -> Path:
        name = lora_uri.split("://", 1)[1]
        await asyncio.to_thread(shutil.copytree, self.store / name, dest_path, dirs_exist_ok=True)
        return dest_path


class CountingSource(DownloadOnlySource):
    """Has ``exists`` too, and counts the downloads it was asked for."""

    def __init__(self, store: Path) -> None:
        super().__init__(store)
        self.downloads: list[str] = []

    async def exists(self, lora_uri: str) -> bool:
        return (self.store / lora_uri.split("://", 1)[1]).is_dir()

    async def download(self, lora_uri: str, dest_path: Path) -> Path:
        self.downloads.append(lora_uri)
        return await super().download(lora_uri, dest_path)


@pytest.fixture
def store(tmp_path: Path, make_adapter: Callable[..., Path]) -> Path:
    make_adapter(tmp_path / "store" / "pirate")
    return tmp_path / "store"


def test_lora_manager_without_arguments_honours_dyn_lora_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYN_LORA_PATH", str(tmp_path / "from-env"))
    assert LoRAManager().config.cache_dir == tmp_path / "from-env"
    assert LoRAManager(cache_path=tmp_path / "given").config.cache_dir == tmp_path / "given"


async def test_download_lora_answers_success_with_local_path_and_error_with_message(
    tmp_path: Path, store: Path
) -> None:
    manager = LoRAManager(cache_path=tmp_path / "cache")
    manager.register_custom_source("store", DownloadOnlySource(store))

    ok = await manager.download_lora("store://pirate")
    failed = await manager.download_lora("nosuch://pirate")

    assert ok == {"status": "success", "local_path": ok["local_path"]}
    assert Path(ok["local_path"]).parent == tmp_path / "cache"
    assert (Path(ok["local_path"]) / "adapter_config.json").is_file()
    assert failed["status"] == "error" and set(failed) == {"status", "code", "message"}
    assert "scheme 'nosuch' has no source" in failed["message"]


async def test_exists_is_asked_first_and_no_means_lora_not_found(
    tmp_path: Path, store: Path
) -> None:
    source = CountingSource(store)
    manager = LoRAManager(cache_path=tmp_path / "cache")
    manager.register_custom_source("store", source)

    missing = await manager.download_lora("store://ghost")
    present = await manager.download_lora("store://pirate")

    assert missing["status"] == "error"
    assert "LoRA not found at store://ghost" in missing["message"]
    assert present["status"] == "success"
    assert source.downloads == ["store://pirate"]


def test_a_source_without_an_async_download_is_refused(tmp_path: Path) -> None:
    class NoDownload:
        def download(self, uri: str, dest: Path) -> Path:  # not async
            return dest

    with pytest.raises(LoraConfigError, match="no async download"):
        LoRAManager(cache_path=tmp_path).register_custom_source("x", NoDownload())


async def test_seed_nim_style_custom_downloader_works_as_written(
    tmp_path: Path, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The example of docs/lora-manager.md ("A NIM-style custom downloader"), as written there.
    monkeypatch.setenv("DYN_LORA_PATH", str(tmp_path / "loras"))
    monkeypatch.setenv("NIM_PEFT_SOURCE", str(store))

    class NIMDownloader:
        """Copies adapters from a NIM-style PEFT store (``NIM_PEFT_SOURCE``): nim://<name>."""

        async def download(self, lora_uri: str, dest_path: Path) -> Path:
            name = lora_uri.removeprefix("nim://")
            source = Path(os.environ["NIM_PEFT_SOURCE"]) / name
            await asyncio.to_thread(shutil.copytree, source, dest_path, dirs_exist_ok=True)
            return dest_path

    manager = LoRAManager()
    manager.register_custom_source("nim", NIMDownloader())
    result = await manager.download_lora("nim://pirate")
    assert result["status"] == "success", result
    local_path = result["local_path"]

    assert Path(local_path).parent == tmp_path / "loras"
    assert (Path(local_path) / "adapter_model.safetensors").is_file()


def _dynamo_s3_env(monkeypatch: pytest.MonkeyPatch, endpoint: str, allow_http: str | None) -> None:
    """Dynamo's MinIO example: AWS_ENDPOINT (not boto3's AWS_ENDPOINT_URL) and AWS_ALLOW_HTTP."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT", endpoint)
    if allow_http is None:
        monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    else:
        monkeypatch.setenv("AWS_ALLOW_HTTP", allow_http)


async def test_aws_endpoint_with_aws_allow_http_downloads_from_moto(
    tmp_path: Path, aws_env: Any, upload: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = upload("adapters/pirate")
    _dynamo_s3_env(monkeypatch, aws_env.endpoint, "true")
    aws_env.reset_requests()

    result = await LoRAManager(cache_path=tmp_path / "cache").download_lora(uri)

    assert result["status"] == "success", result
    assert (Path(result["local_path"]) / "adapter_config.json").is_file()
    assert aws_env.requests(), "the download must have gone to the moto server"


async def test_plain_http_aws_endpoint_without_aws_allow_http_is_refused_before_any_request(
    tmp_path: Path, aws_env: Any, upload: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = upload("adapters/pirate")
    _dynamo_s3_env(monkeypatch, aws_env.endpoint, None)
    aws_env.reset_requests()

    result = await LoRAManager(cache_path=tmp_path / "cache").download_lora(uri)

    assert result["status"] == "error"
    assert "AWS_ALLOW_HTTP=true" in result["message"]
    assert aws_env.requests() == []


# No Hugging Face Hub is reachable from the test machines: hf:// is tested against a local
# stand-in (tests/worker/lora/hub_stand_in.py) that serves the few endpoints huggingface_hub
# calls, through HF_ENDPOINT.


def _files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in directory.iterdir()}


@pytest.fixture
def hub_repo(adapter_bytes: Callable[..., dict[str, bytes]]) -> HubRepo:
    return HubRepo("org/pirate-lora", adapter_bytes(), revision="v1", token="hf_test_token")


async def test_hf_uri_downloads_through_hf_endpoint_with_hf_token(
    tmp_path: Path, hub_repo: HubRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serve_hub(hub_repo) as endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        manager = LoRAManager(cache_path=tmp_path / "cache")

        result = await manager.download_lora("hf://org/pirate-lora@v1")
        hub_repo.requests.clear()
        again = await manager.download_lora("hf://org/pirate-lora@v1")

    assert result["status"] == "success", result
    assert _files(Path(result["local_path"])) == hub_repo.files
    assert again == result and hub_repo.requests == []  # a cache hit makes no request


async def test_hf_uri_with_a_wrong_token_or_unknown_repo_is_an_error_without_the_token(
    tmp_path: Path, hub_repo: HubRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serve_hub(hub_repo) as endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        monkeypatch.setenv("HF_TOKEN", "hf_wrong_token")
        manager = LoRAManager(cache_path=tmp_path / "cache")
        refused = await manager.download_lora("hf://org/pirate-lora@v1")
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        unknown = await manager.download_lora("hf://org/nothing")

    assert refused["status"] == unknown["status"] == "error"
    assert endpoint in refused["message"] and "HF_TOKEN" in refused["message"]
    assert "hf_wrong_token" not in refused["message"]
    assert "no such repository" in unknown["message"]


async def test_malformed_hf_uri_is_refused_without_a_request(tmp_path: Path) -> None:
    result = await LoRAManager(cache_path=tmp_path / "cache").download_lora("hf://a/b/c")
    assert result["status"] == "error" and "hf://org/name[@revision]" in result["message"]
