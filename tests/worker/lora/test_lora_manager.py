"""LoRAManager with custom sources: registration, configuration, fallback, one fetch, the cap."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lorafleet.worker.lora import (
    LoraConfigError,
    LoraInvalidAdapterError,
    LoraInvalidUriError,
    LoRAManager,
    LoRAManagerConfig,
    LoraNotFoundError,
    LoraSourceError,
    LoraUnavailableError,
)
from lorafleet.worker.lora.lora_manager import SIZE_CHECK_INTERVAL_S
from lorafleet.worker.lora.uri import cache_key


class RecordingSource:
    """A custom source that writes a real adapter (or fails as told) and counts its calls."""

    def __init__(
        self,
        write: Callable[[Path], Any] | None,
        *,
        fail: Exception | None = None,
        gate: asyncio.Event | None = None,
        name: str = "recording",
    ) -> None:
        self.name = name
        self.calls: list[str] = []
        self.started = asyncio.Event()
        """Set when the first download begins (it then waits for ``gate``)."""
        self._write, self._fail, self._gate = write, fail, gate

    async def download(self, uri: str, dest: Path) -> Path:
        self.calls.append(uri)
        self.started.set()
        if self._gate is not None:
            await self._gate.wait()
        if self._fail is not None:
            raise self._fail
        assert self._write is not None
        await asyncio.to_thread(self._write, dest)
        return dest

    async def exists(self, uri: str) -> bool:
        return True  # "cannot tell": the manager asks before each download


def _manager(tmp_path: Path, **config: Any) -> LoRAManager:
    return LoRAManager(config=LoRAManagerConfig(cache_dir=tmp_path / "cache", **config))


def _entries(tmp_path: Path) -> set[str]:
    return {p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")}


async def test_custom_source_registered_in_python_is_used_and_cached(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    source = RecordingSource(make_adapter)
    manager = _manager(tmp_path)
    manager.register_custom_source("demo", source)

    path = await manager.download("demo://pirate")

    assert "demo" in manager.supported_schemes()
    assert path == tmp_path / "cache" / cache_key("demo://pirate")
    assert path.name.startswith("demo_") and (path / "adapter_config.json").is_file()
    assert manager.is_cached("demo://pirate")
    assert await manager.download("demo://pirate") == path
    assert source.calls == ["demo://pirate"]


CONFIGURED_SOURCE = '''
import asyncio, json
from pathlib import Path

class ConfiguredSource:
    """A source a deployment names in DYN_LORA_SOURCES; it knows nothing of the tests."""

    async def download(self, uri: str, dest: Path) -> Path:
        def write() -> None:
            (dest / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
            header = json.dumps({"__metadata__": {"source": uri}}).encode()
            weights = len(header).to_bytes(8, "little") + header  # safetensors of no tensor
            (dest / "adapter_model.safetensors").write_bytes(weights)
        await asyncio.to_thread(write)
        return dest

    async def exists(self, uri: str) -> bool:
        return True
'''


async def test_custom_source_named_in_configuration_is_imported_and_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"lorafleet_test_source_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(CONFIGURED_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {
        "DYN_LORA_PATH": str(tmp_path / "cache"),
        "DYN_LORA_SOURCES": f"cfg={module}:ConfiguredSource",
    }

    manager = LoRAManager.from_env(env)
    path = await manager.download("cfg://robot")

    assert manager.supported_schemes() == {"file", "s3", "hf", "cfg"}
    assert b'{"source": "cfg://robot"}' in (path / "adapter_model.safetensors").read_bytes()


async def test_failing_source_falls_through_to_the_next_one(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    failing = RecordingSource(None, fail=LoraUnavailableError("demo://x", "mirror down"))
    working = RecordingSource(make_adapter)
    manager = _manager(tmp_path)
    manager.register_custom_source("demo", failing)
    manager.register_custom_source("demo", working)

    path = await manager.download("demo://x")

    assert failing.calls == working.calls == ["demo://x"]
    assert manager.is_cached("demo://x") and path.is_dir()


async def test_when_every_source_fails_the_error_keeps_each_failure_without_secrets(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    uri = "demo://robot:hunter2@mirror/x?token=s3cr3t"
    crashing = RecordingSource(None, fail=RuntimeError("boom hunter2 s3cr3t"), name="mirror")
    missing = RecordingSource(None, fail=LoraNotFoundError(uri, "no such adapter"), name="origin")
    manager = _manager(tmp_path)
    manager.register_custom_source("demo", crashing)
    manager.register_custom_source("demo", missing)

    with pytest.raises(LoraSourceError) as caught:
        await manager.download(uri)

    error = caught.value
    assert isinstance(error, LoraUnavailableError) and error.code == "unavailable"
    assert len(error.failures) == 2
    assert "all 2 sources failed" in error.message
    assert "[1] mirror: source mirror failed with RuntimeError" in error.message
    assert "[2] origin: no such adapter" in error.message
    assert "demo://***@mirror/x?token=***" in error.message
    logged = capfd.readouterr()
    for secret in ("hunter2", "s3cr3t"):
        assert secret not in error.message and secret not in logged.out + logged.err


async def test_concurrent_downloads_share_one_fetch_even_if_a_caller_is_cancelled(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    gate = asyncio.Event()
    source = RecordingSource(make_adapter, gate=gate)
    manager = _manager(tmp_path)
    manager.register_custom_source("demo", source)
    waiters = [asyncio.create_task(manager.download("demo://x")) for _ in range(5)]
    await source.started.wait()

    waiters[0].cancel()
    gate.set()
    paths = await asyncio.gather(*waiters[1:])

    assert source.calls == ["demo://x"]
    assert len(set(paths)) == 1 and manager.is_cached("demo://x")


async def test_invalid_files_from_a_source_are_refused_and_not_cached(tmp_path: Path) -> None:
    def write_config_only(dest: Path) -> None:
        (dest / "adapter_config.json").write_text('{"peft_type": "LORA"}')

    manager = _manager(tmp_path)
    manager.register_custom_source("demo", RecordingSource(write_config_only))

    with pytest.raises(LoraInvalidAdapterError, match=r"adapter_model\.safetensors"):
        await manager.download("demo://half")

    assert _entries(tmp_path) == set()
    assert list((tmp_path / "cache" / ".tmp").iterdir()) == []


async def test_partial_cache_entry_is_replaced_by_a_fresh_download(
    tmp_path: Path, make_adapter: Callable[..., Path], adapter_bytes: Callable[..., Any]
) -> None:
    source = RecordingSource(make_adapter)
    manager = _manager(tmp_path)
    manager.register_custom_source("demo", source)
    partial = tmp_path / "cache" / cache_key("demo://x")
    partial.mkdir(parents=True)
    (partial / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    cut = adapter_bytes()["adapter_model.safetensors"][:-10]
    (partial / "adapter_model.safetensors").write_bytes(cut)

    assert not manager.is_cached("demo://x")
    assert await manager.download("demo://x") == partial

    assert source.calls == ["demo://x"] and manager.is_cached("demo://x")


async def test_unknown_and_disallowed_schemes_are_refused_before_any_work(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    source = RecordingSource(make_adapter)
    manager = _manager(tmp_path, allowed_schemes=frozenset({"file"}))
    manager.register_custom_source("demo", source)

    assert manager.supported_schemes() == {"file"}
    for uri, why in [
        ("s3://b/p", "not allowed"),
        ("demo://x", "not allowed"),
        ("ftp://h/x", "no source"),
    ]:
        with pytest.raises(LoraInvalidUriError, match=why) as caught:
            await manager.download(uri)
        assert caught.value.code == "invalid_request" and "use one of: file" in caught.value.message
        assert not manager.is_cached(uri)
    assert source.calls == []


def test_registering_something_that_is_not_a_source_is_a_config_error(tmp_path: Path) -> None:
    manager = _manager(tmp_path)

    with pytest.raises(LoraConfigError, match="no async download"):
        manager.register_custom_source("demo", object())  # type: ignore[arg-type]
    with pytest.raises(LoraConfigError, match="invalid scheme"):
        manager.register_custom_source("Bad Scheme", RecordingSource(None))


def _entry_bytes(adapter_bytes: Callable[..., dict[str, bytes]]) -> int:
    return sum(len(data) for data in adapter_bytes().values())


async def test_cap_evicts_the_least_recently_used_entry(
    tmp_path: Path, make_adapter: Callable[..., Path], adapter_bytes: Callable[..., Any]
) -> None:
    manager = _manager(tmp_path, cache_max_bytes=_entry_bytes(adapter_bytes) * 5 // 2)
    manager.register_custom_source("demo", RecordingSource(make_adapter))
    await manager.download("demo://a")
    await manager.download("demo://b")
    await manager.download("demo://a")  # a is now more recent than b

    await manager.download("demo://c")

    assert [manager.is_cached(f"demo://{n}") for n in "abc"] == [True, False, True]
    assert _entries(tmp_path) == {cache_key("demo://a"), cache_key("demo://c")}


async def test_cap_never_evicts_an_entry_in_use_until_it_is_released(
    tmp_path: Path, make_adapter: Callable[..., Path], adapter_bytes: Callable[..., Any]
) -> None:
    manager = _manager(tmp_path, cache_max_bytes=_entry_bytes(adapter_bytes) * 3 // 2)
    other_worker = _manager(tmp_path)  # shares the cache directory
    for m in (manager, other_worker):
        m.register_custom_source("demo", RecordingSource(make_adapter))
    await manager.acquire("demo://a")
    await other_worker.acquire("demo://b")

    await manager.download("demo://c")
    assert [manager.is_cached(f"demo://{n}") for n in "abc"] == [True, True, True]
    manager.release("demo://a")
    other_worker.release("demo://b")
    await manager.download("demo://d")

    assert [manager.is_cached(f"demo://{n}") for n in "abcd"] == [False, False, False, True]


async def test_unwritable_cache_directory_is_reported_not_raised_bare(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    manager = LoRAManager(config=LoRAManagerConfig(cache_dir=tmp_path / "a-file" / "cache"))
    manager.register_custom_source("demo", RecordingSource(make_adapter))

    with pytest.raises(LoraUnavailableError) as caught:
        await manager.download("demo://x")

    assert "local file system error (NotADirectoryError" in caught.value.message
    assert str(tmp_path / "a-file" / "cache") in caught.value.message
    with pytest.raises(LoraUnavailableError, match="local file system error"):
        await manager.acquire("demo://x")
    assert not manager.is_cached("demo://x")


async def test_release_makes_an_acquired_entry_evictable_and_tolerates_extra_calls(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    manager = _manager(tmp_path, cache_max_bytes=1)
    manager.register_custom_source("demo", RecordingSource(make_adapter))
    await manager.acquire("demo://a")
    await manager.acquire("demo://a")  # loaded twice (e.g. two names), released twice

    manager.release("demo://a")
    await manager.download("demo://b")
    assert manager.is_cached("demo://a")
    manager.release("demo://a")
    manager.release("demo://a")  # one too many: logged, harmless
    await manager.download("demo://c")

    assert not manager.is_cached("demo://a") and manager.is_cached("demo://c")


async def test_aclose_cancels_downloads_in_flight_and_leaves_nothing_behind(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    gate = asyncio.Event()
    async with _manager(tmp_path) as manager:
        source = RecordingSource(make_adapter, gate=gate)
        manager.register_custom_source("demo", source)
        waiter = asyncio.create_task(manager.download("demo://x"))
        await source.started.wait()

    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert list((tmp_path / "cache" / ".tmp").iterdir()) == []
    assert not manager.is_cached("demo://x")


async def test_a_source_writing_past_the_size_bound_is_cut_off_and_leaves_nothing(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    written: list[int] = []

    async def flood(dest: Path) -> None:
        """A custom source that claims nothing and writes without end."""
        with (dest / "adapter_model.safetensors").open("wb") as out:
            while True:
                out.write(b"\0" * 4096)
                out.flush()
                written.append(4096)
                await asyncio.sleep(0)

    class Flood:
        async def download(self, uri: str, dest: Path) -> Path:
            await flood(dest)
            return dest

    manager = _manager(tmp_path, max_adapter_bytes=64 << 10)
    manager.register_custom_source("flood", Flood())

    with pytest.raises(LoraInvalidAdapterError, match="DYN_LORA_MAX_BYTES"):
        await manager.download("flood://big")

    assert sum(written) > 64 << 10
    assert _entries(tmp_path) == set()
    assert not any((tmp_path / "cache").rglob("adapter_model.safetensors"))


async def test_a_source_bookkeeping_is_not_counted_against_the_adapter_bound(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    """A source may keep files of its own in its download while it runs (huggingface_hub's
    ``.cache``): with the bound set to the adapter's exact size, the download goes through."""
    probe = make_adapter(tmp_path / "probe")
    exact = sum(p.stat().st_size for p in probe.rglob("*") if p.is_file())

    class Bookkeeping:
        bookkeeping = (".scratch",)

        async def download(self, uri: str, dest: Path) -> Path:
            make_adapter(dest)
            (dest / ".scratch").mkdir()
            (dest / ".scratch" / "progress").write_bytes(b"\0" * (64 << 10))
            # a download still running: several of the manager's size checks see it
            await asyncio.sleep(SIZE_CHECK_INTERVAL_S * 5)
            shutil.rmtree(dest / ".scratch")
            return dest

        async def exists(self, uri: str) -> bool:
            return True

    manager = _manager(tmp_path, max_adapter_bytes=exact)
    manager.register_custom_source("books", Bookkeeping())

    path = await manager.download("books://pirate")

    assert (path / "adapter_config.json").is_file() and not (path / ".scratch").exists()


def _write_odd_member(
    kind: str, outside: Path, make_adapter: Callable[..., Path]
) -> Callable[[Path], None]:
    """A download that writes a whole adapter plus one link or FIFO beside its files."""

    def write(dest: Path) -> None:
        make_adapter(dest)
        odd = dest / "new_embeddings.safetensors"
        if kind == "symlink":
            odd.symlink_to(outside)
        else:
            os.mkfifo(odd)

    return write


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
async def test_a_source_that_writes_a_link_or_a_fifo_is_refused_and_nothing_cached(
    tmp_path: Path, make_adapter: Callable[..., Path], kind: str
) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("not an adapter file")
    manager = _manager(tmp_path)
    manager.register_custom_source(
        "odd", RecordingSource(_write_odd_member(kind, outside, make_adapter))
    )

    with pytest.raises(LoraInvalidAdapterError, match="link or special file") as refused:
        await manager.download("odd://adapter")

    assert refused.value.code == "invalid_request"
    assert "new_embeddings.safetensors" in str(refused.value)
    assert _entries(tmp_path) == set() and not manager.is_cached("odd://adapter")
    assert list((tmp_path / "cache" / ".tmp").iterdir()) == []
    assert outside.read_text() == "not an adapter file"
