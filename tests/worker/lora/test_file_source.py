"""The file:// source: validated, used in place (never copied), optionally confined to roots."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from lorafleet.worker.lora import (
    LoraInvalidAdapterError,
    LoraInvalidUriError,
    LoRAManager,
    LoRAManagerConfig,
    LoraNotFoundError,
)


def _manager(tmp_path: Path, roots: tuple[Path, ...] = ()) -> LoRAManager:
    return LoRAManager(config=LoRAManagerConfig(cache_dir=tmp_path / "cache", file_roots=roots))


async def test_valid_directory_is_used_in_place_and_not_copied(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    adapter = make_adapter(tmp_path / "adapters" / "pirate")
    manager = _manager(tmp_path)

    assert manager.is_cached(adapter.as_uri())
    assert await manager.download(adapter.as_uri()) == adapter
    assert not (tmp_path / "cache").exists() or not any(
        p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")
    )


async def test_percent_encoded_path_with_spaces_is_decoded(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    adapter = make_adapter(tmp_path / "my adapters" / "pirate")

    assert await _manager(tmp_path).download(adapter.as_uri()) == adapter


async def test_missing_path_is_not_found(tmp_path: Path) -> None:
    uri = (tmp_path / "nowhere").as_uri()
    manager = _manager(tmp_path)

    with pytest.raises(LoraNotFoundError) as caught:
        await manager.download(uri)

    assert caught.value.code == "not_found" and uri in caught.value.message
    assert not manager.is_cached(uri)


async def test_a_file_instead_of_a_directory_is_refused(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    config = make_adapter(tmp_path / "pirate") / "adapter_config.json"

    with pytest.raises(LoraInvalidAdapterError, match="not a directory"):
        await _manager(tmp_path).download(config.as_uri())


async def test_directory_without_weights_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "half"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA"}')

    with pytest.raises(LoraInvalidAdapterError, match=r"adapter_model\.safetensors"):
        await _manager(tmp_path).download(folder.as_uri())


async def test_path_outside_allowed_roots_is_refused_even_through_a_symlink(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    inside = make_adapter(tmp_path / "allowed" / "pirate")
    outside = make_adapter(tmp_path / "private" / "robot")
    (tmp_path / "allowed" / "sneaky").symlink_to(outside)
    manager = _manager(tmp_path, roots=(tmp_path / "allowed",))

    assert await manager.download(inside.as_uri()) == inside
    for uri in (outside.as_uri(), (tmp_path / "allowed" / "sneaky").as_uri()):
        with pytest.raises(LoraInvalidUriError) as caught:
            await manager.download(uri)
        assert "outside the allowed roots" in caught.value.message
        assert "DYN_LORA_FILE_ROOTS" in caught.value.message
        assert not manager.is_cached(uri)


async def test_missing_path_outside_roots_does_not_reveal_whether_it_exists(
    tmp_path: Path,
) -> None:
    manager = _manager(tmp_path, roots=(tmp_path / "allowed",))

    with pytest.raises(LoraInvalidUriError, match="outside the allowed roots"):
        await manager.download("file:///etc/definitely-not-here")


@pytest.mark.parametrize(
    "uri", ["file://otherhost/adapters/x", "file:///adapters/x?rev=2", "file://relative/x"]
)
async def test_file_uri_naming_a_host_or_query_is_invalid(tmp_path: Path, uri: str) -> None:
    with pytest.raises(LoraInvalidUriError):
        await _manager(tmp_path).download(uri)


@pytest.mark.parametrize("link", ["adapter_model.safetensors", "adapter_config.json", "sub"])
async def test_a_link_inside_the_adapter_leading_outside_the_roots_is_refused(
    tmp_path: Path, make_adapter: Callable[..., Path], link: str
) -> None:
    adapter = make_adapter(tmp_path / "allowed" / "pirate")
    secret = make_adapter(tmp_path / "private" / "keys")
    target = secret if link == "sub" else secret / link
    (adapter / link).unlink(missing_ok=True)
    (adapter / link).symlink_to(target)
    manager = _manager(tmp_path, roots=(tmp_path / "allowed",))

    with pytest.raises(LoraInvalidAdapterError) as caught:
        await manager.download(adapter.as_uri())

    message = caught.value.message
    assert f"{link} is a symbolic link that leads outside the allowed roots" in message
    assert "private" not in message  # where it leads stays unsaid
    assert caught.value.code == "invalid_request"


async def test_links_that_stay_inside_the_roots_are_followed_and_checked(
    tmp_path: Path, make_adapter: Callable[..., Path]
) -> None:
    shared = make_adapter(tmp_path / "allowed" / "shared")
    adapter = make_adapter(tmp_path / "allowed" / "pirate")
    (adapter / "adapter_model.safetensors").unlink()
    (adapter / "adapter_model.safetensors").symlink_to(shared / "adapter_model.safetensors")
    (adapter / "loop").symlink_to(adapter)
    (adapter / "nested").symlink_to(shared)
    manager = _manager(tmp_path, roots=(tmp_path / "allowed",))
    assert await manager.download(adapter.as_uri()) == adapter

    (shared / "leak").symlink_to(tmp_path / "private")  # reached through ``nested``
    with pytest.raises(LoraInvalidAdapterError, match="nested/leak is a symbolic link"):
        await manager.download(adapter.as_uri())


def _add_odd_member(adapter: Path, kind: str) -> None:
    """Put a FIFO, or a link to a character device, beside the adapter's files."""
    odd = adapter / "new_embeddings.safetensors"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to("/dev/zero")  # no device can be made without root; a link reaches one


@pytest.mark.parametrize("kind", ["fifo", "link to a device"])
async def test_a_fifo_or_a_link_to_a_device_inside_the_adapter_is_refused_without_roots_too(
    tmp_path: Path, make_adapter: Callable[..., Path], kind: str
) -> None:
    adapter = make_adapter(tmp_path / "pirate")
    _add_odd_member(adapter, kind)
    manager = _manager(tmp_path)

    with pytest.raises(LoraInvalidAdapterError) as caught:
        await manager.download(adapter.as_uri())

    assert "new_embeddings.safetensors is a device, FIFO or socket" in caught.value.message
    assert caught.value.code == "invalid_request"
    assert not manager.is_cached(adapter.as_uri())
