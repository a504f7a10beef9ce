"""Place remote names (S3 keys, archive members, hub files) under a destination without
escaping it, and check that a download holds nothing but files and folders.

Any name that is absolute, contains ``..``, or resolves outside the destination
is refused with :class:`LoraInvalidAdapterError`; nothing is written for it. An
archive is extracted within ``DYN_LORA_MAX_BYTES``: the sizes its members declare
are added up before any is written, and the bytes are counted as they are written.
What a source wrote is refused if it holds a link, a device, a FIFO or a socket
(:func:`check_plain_tree`), whichever source wrote it.
"""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO, Final

from lorafleet.worker.lora._budget import ByteBudget
from lorafleet.worker.lora.errors import LoraInvalidAdapterError

__all__ = [
    "ARCHIVE_MEMBERS_MAX",
    "ARCHIVE_SUFFIXES",
    "check_plain_tree",
    "extract_archive",
    "is_archive_name",
    "safe_join",
]

ARCHIVE_SUFFIXES: Final = (".tar.gz", ".tgz", ".tar", ".zip")
ARCHIVE_MEMBERS_MAX: Final = 1000
"""Members (files and folders) one archive may hold, as many as objects under an S3 prefix:
a PEFT adapter has a handful, and each member costs an inode whatever its size."""
CHUNK_BYTES: Final = 1 << 20
"""What one write copies; the budget is checked before each."""


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


def extract_archive(
    archive: Path, dest: Path, *, uri: str, budget: ByteBudget | None = None
) -> None:
    """Extract a tar (optionally gzip) or zip archive into ``dest``, refusing unsafe members.

    With a ``budget`` (``DYN_LORA_MAX_BYTES``), the members' declared sizes are added up
    before anything is written, and every chunk is counted before it is written: an
    archive that expands past the bound is refused having written at most the bound.
    """
    budget = budget or ByteBudget(uri, None)
    try:
        if zipfile.is_zipfile(archive):
            _extract_zip(archive, dest, uri=uri, budget=budget)
        else:
            _extract_tar(archive, dest, uri=uri, budget=budget)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise LoraInvalidAdapterError(
            uri, f"archive cannot be extracted ({type(exc).__name__})", hint="re-upload the archive"
        ) from exc


def _extract_zip(archive: Path, dest: Path, *, uri: str, budget: ByteBudget) -> None:
    with zipfile.ZipFile(archive) as zipped:
        declared = _Declared(dest, uri, budget)
        members = [
            (declared.add(info.filename, is_dir=info.is_dir(), size=info.file_size), info)
            for info in zipped.infolist()
        ]
        for target, info in members:
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            with zipped.open(info) as src:
                _write(src, target, budget)


def _extract_tar(archive: Path, dest: Path, *, uri: str, budget: ByteBudget) -> None:
    with tarfile.open(archive) as tar:
        declared = _Declared(dest, uri, budget)
        members: list[tuple[Path, tarfile.TarInfo]] = []
        for member in tar:  # one header at a time: a refused member stops the reading
            target = declared.add(member.name, is_dir=member.isdir(), size=member.size)
            if not (member.isfile() or member.isdir()):
                raise LoraInvalidAdapterError(
                    uri,
                    f"member {member.name!r} is a link or special file",
                    hint="an adapter may hold only regular files and directories",
                )
            members.append((target, member))
        for target, member in members:
            src = tar.extractfile(member)
            if src is None:  # a directory
                target.mkdir(parents=True, exist_ok=True)
                continue
            with src:
                _write(src, target, budget)


class _Declared:
    """The members an archive declares, placed and added up before any is written."""

    def __init__(self, dest: Path, uri: str, budget: ByteBudget) -> None:
        self._dest, self._uri, self._budget = dest, uri, budget
        self._members = self._bytes = 0

    def add(self, name: str, *, is_dir: bool, size: int) -> Path:
        """Return where member ``name`` goes; refuse it if the archive is now over a bound."""
        target = safe_join(self._dest, name, uri=self._uri)
        self._members += 1
        if self._members > ARCHIVE_MEMBERS_MAX:
            raise LoraInvalidAdapterError(
                self._uri,
                f"the archive holds more than {ARCHIVE_MEMBERS_MAX} members",
                hint="archive a single adapter's files",
            )
        if not is_dir:
            self._bytes += size
            self._budget.check(self._bytes)
        return target


def _write(src: IO[bytes], target: Path, budget: ByteBudget) -> None:
    """Copy ``src`` to ``target``, spending each chunk from ``budget`` before writing it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        while chunk := src.read(CHUNK_BYTES):
            budget(len(chunk))
            out.write(chunk)
