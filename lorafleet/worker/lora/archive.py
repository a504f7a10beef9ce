"""Place remote names (S3 keys, archive members, hub files) under a destination without
escaping it, and check that a download holds nothing but files and folders.

Any name that is absolute, contains ``..``, or resolves outside the destination
is refused with :class:`LoraInvalidAdapterError`; nothing is written for it. What a
source wrote is refused if it holds a link, a device, a FIFO or a socket
(:func:`check_plain_tree`), whichever source wrote it.
"""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Final

from lorafleet.worker.lora.errors import LoraInvalidAdapterError

__all__ = [
    "ARCHIVE_SUFFIXES",
    "check_plain_tree",
    "extract_archive",
    "is_archive_name",
    "safe_join",
]

ARCHIVE_SUFFIXES: Final = (".tar.gz", ".tgz", ".tar", ".zip")


def is_archive_name(name: str) -> bool:
    """Return whether ``name`` ends like an archive this module can extract."""
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def safe_join(dest: Path, name: str, *, uri: str) -> Path:
    """Return ``dest / name``, refusing a name that would land outside ``dest``."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    unsafe = not parts or name.startswith(("/", "\\")) or ".." in parts
    target = dest.joinpath(*parts) if parts else dest
    if unsafe or not target.resolve().is_relative_to(dest.resolve()):
        raise LoraInvalidAdapterError(
            uri,
            f"member {name!r} would be written outside the adapter directory",
            hint="remove or rename that object; keys and members must be relative paths",
        )
    return target


def check_plain_tree(root: Path, *, uri: str) -> None:
    """Refuse a downloaded adapter ``root`` holding anything but regular files and folders.

    A link would make the cache entry (and the engine reading it) lead anywhere on the
    worker's disk; a device or a FIFO would be read without end. Links are not followed.
    """
    for folder, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                member = Path(folder, name).relative_to(root).as_posix()
                raise LoraInvalidAdapterError(
                    uri,
                    f"member {member!r} is a link or special file",
                    hint="an adapter may hold only regular files and directories",
                )


def extract_archive(archive: Path, dest: Path, *, uri: str) -> None:
    """Extract a tar (optionally gzip) or zip archive into ``dest``, refusing unsafe members."""
    try:
        if zipfile.is_zipfile(archive):
            _extract_zip(archive, dest, uri=uri)
        else:
            _extract_tar(archive, dest, uri=uri)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise LoraInvalidAdapterError(
            uri, f"archive cannot be extracted ({type(exc).__name__})", hint="re-upload the archive"
        ) from exc


def _extract_zip(archive: Path, dest: Path, *, uri: str) -> None:
    with zipfile.ZipFile(archive) as zipped:
        for info in zipped.infolist():
            target = safe_join(dest, info.filename, uri=uri)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zipped.open(info) as src, target.open("wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)


def _extract_tar(archive: Path, dest: Path, *, uri: str) -> None:
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for member in members:
            safe_join(dest, member.name, uri=uri)
            if not (member.isfile() or member.isdir()):
                raise LoraInvalidAdapterError(
                    uri,
                    f"member {member.name!r} is a link or special file",
                    hint="an adapter may hold only regular files and directories",
                )
        tar.extractall(dest, members=members, filter="data")
