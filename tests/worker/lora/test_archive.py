"""Archive extraction and key placement never write outside the destination, nor past the
adapter bound."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from lorafleet.worker.lora._budget import ByteBudget
from lorafleet.worker.lora.archive import ARCHIVE_MEMBERS_MAX, extract_archive, safe_join
from lorafleet.worker.lora.errors import LoraInvalidAdapterError

URI = "s3://bucket/adapter.tar.gz"


def _tar(path: Path, members: dict[str, bytes], *, link: str | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo("weights")
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
    return path


@pytest.mark.parametrize("name", ["../escape.txt", "/abs/escape.txt", "a/../../escape.txt"])
def test_tar_member_outside_the_destination_is_refused(tmp_path: Path, name: str) -> None:
    archive = _tar(tmp_path / "a.tar.gz", {"adapter_config.json": b"{}", name: b"x"})
    dest = tmp_path / "dest"
    dest.mkdir()

    with pytest.raises(LoraInvalidAdapterError, match="outside the adapter directory"):
        extract_archive(archive, dest, uri=URI)

    assert list(dest.iterdir()) == [] and not list(tmp_path.rglob("escape.txt"))


def test_tar_symlink_member_is_refused(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar.gz", {"adapter_config.json": b"{}"}, link="/etc/passwd")
    dest = tmp_path / "dest"
    dest.mkdir()

    with pytest.raises(LoraInvalidAdapterError, match="link or special file"):
        extract_archive(archive, dest, uri=URI)


def test_zip_member_outside_the_destination_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("adapter_config.json", b"{}")
        zipped.writestr("../escape.txt", b"x")
    dest = tmp_path / "dest"
    dest.mkdir()

    with pytest.raises(LoraInvalidAdapterError, match="outside the adapter directory"):
        extract_archive(archive, dest, uri=URI)

    assert not list(tmp_path.rglob("escape.txt"))


def test_zip_and_tar_with_safe_members_extract(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("sub/adapter_config.json", b"{}")
    _tar(tmp_path / "b.tar.gz", {"adapter_config.json": b"{}"})

    extract_archive(archive, tmp_path / "z", uri=URI)
    extract_archive(tmp_path / "b.tar.gz", tmp_path / "t", uri=URI)

    assert (tmp_path / "z" / "sub" / "adapter_config.json").read_bytes() == b"{}"
    assert (tmp_path / "t" / "adapter_config.json").read_bytes() == b"{}"


def test_safe_join_refuses_a_symlinked_folder_leading_outside(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "link").symlink_to(tmp_path)

    with pytest.raises(LoraInvalidAdapterError):
        safe_join(dest, "link/escape.txt", uri=URI)
    assert safe_join(dest, "sub/ok.txt", uri=URI) == dest / "sub" / "ok.txt"


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_members_declaring_more_than_the_bound_are_refused_before_a_byte_is_written(
    tmp_path: Path, kind: str
) -> None:
    members = {"adapter_config.json": b"{}", "a.bin": bytes(600), "b.bin": bytes(600)}
    archive = tmp_path / f"a.{kind}"
    if kind == "tar":
        _tar(archive, members)
    else:
        with zipfile.ZipFile(archive, "w") as zipped:
            for name, data in members.items():
                zipped.writestr(name, data)
    dest = tmp_path / "dest"
    dest.mkdir()

    with pytest.raises(LoraInvalidAdapterError, match=r"DYN_LORA_MAX_BYTES \(1202 > 1000 bytes\)"):
        extract_archive(archive, dest, uri=URI, budget=ByteBudget(URI, 1000))

    assert list(dest.iterdir()) == []
    extract_archive(archive, dest, uri=URI, budget=ByteBudget(URI, 1202))  # at the bound: fits
    assert (dest / "b.bin").read_bytes() == bytes(600)


def test_an_archive_of_more_members_than_an_adapter_has_is_refused(tmp_path: Path) -> None:
    empty = {f"f{n}": b"" for n in range(ARCHIVE_MEMBERS_MAX + 1)}
    archive = _tar(tmp_path / "a.tar.gz", empty)
    dest = tmp_path / "dest"
    dest.mkdir()

    with pytest.raises(LoraInvalidAdapterError, match=f"more than {ARCHIVE_MEMBERS_MAX} members"):
        extract_archive(archive, dest, uri=URI)

    assert list(dest.iterdir()) == []
