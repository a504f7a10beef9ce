"""The on-disk adapter cache under ``DYN_LORA_PATH``: entries, private downloads, LRU eviction.

Layout::

    {root}/{scheme}_{hash32}/           one validated adapter per URI, renamed in whole
    {root}/{scheme}_{hash32}/.lorafleet-version   the source's version of it (S3: ETags)
    {root}/.tmp/{key}@{owner}@{rand}/   a download in progress, private to one process
    {root}/.in-use/{key}@{owner}        a loaded adapter uses this entry: never evicted
    {root}/.trash/                      entries on their way out

``{owner}`` is ``host@pid@token`` so that leftovers of a dead process are swept.
Every method blocks on the file system; the manager calls them via ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Final

import structlog

from lorafleet.fleet.adapter_files import adapter_problem
from lorafleet.worker.lora._owner import owner_alive, owner_tag

__all__ = ["AdapterCache"]

TMP_DIR_NAME: Final = ".tmp"
IN_USE_DIR_NAME: Final = ".in-use"
TRASH_DIR_NAME: Final = ".trash"
VERSION_FILE_NAME: Final = ".lorafleet-version"
FOREIGN_STALE_AGE_S: Final = 24 * 3600.0
COMMIT_ATTEMPTS: Final = 3

log = structlog.get_logger(__name__)


class AdapterCache:
    """Entries keyed by ``cache_key(uri)``; valid ones only, replaced whole, evicted by LRU."""

    def __init__(self, root: Path, *, max_bytes: int | None = None) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._tmp = root / TMP_DIR_NAME
        self._in_use = root / IN_USE_DIR_NAME
        self._trash = root / TRASH_DIR_NAME
        self._swept = False
        self._sweep_lock = threading.Lock()

    def lookup(self, key: str, *, touch: bool = True) -> Path | None:
        """Return the entry of ``key`` if it holds a valid adapter, marking it recently used."""
        entry = self.root / key
        if adapter_problem(entry) is not None:
            return None
        if touch:
            _touch(entry)
        return entry

    def new_download_dir(self, key: str) -> Path:
        """Return a fresh empty directory, private to this process, for one download."""
        self._sweep_once()
        return Path(tempfile.mkdtemp(prefix=f"{key}@{owner_tag()}@", dir=self._tmp))

    def discard(self, path: Path) -> None:
        """Delete a download directory (nothing happens if it was committed already)."""
        shutil.rmtree(path, ignore_errors=True)

    def commit(
        self, key: str, built: Path, *, version: str | None = None, replace: bool = False
    ) -> Path:
        """Rename the validated ``built`` directory into place as the entry of ``key``,
        recording the source's ``version`` of it.

        An invalid or partial entry is replaced, and with ``replace`` (the source holds a
        newer version) a valid one too, unless it already is ``version``: workers sharing a
        cache refresh one changed object at once, and replacing another's fresh entry would
        pull it from under the engine loading it. Otherwise a valid entry that another
        process committed meanwhile wins, and ``built`` is left for the caller to discard.
        """
        entry = self.root / key
        if version is not None:
            (built / VERSION_FILE_NAME).write_text(version)
        for _ in range(COMMIT_ATTEMPTS):
            if self.lookup(key) is not None and (
                not replace or (version is not None and self.version_of(key) == version)
            ):
                return entry
            replace = False  # once: an entry committed meanwhile is as new as this one
            if entry.exists() or entry.is_symlink():
                self._remove(entry)
            try:
                os.rename(built, entry)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                continue
            _touch(entry)
            return entry
        raise OSError(errno.EEXIST, f"cache entry {key} kept changing under this process")

    def version_of(self, key: str) -> str | None:
        """The source's version recorded with the entry of ``key``; None when none was, or
        it cannot be read (the entry is then fetched again)."""
        try:
            return (self.root / key / VERSION_FILE_NAME).read_text()
        except OSError:
            return None

    def remove(self, key: str) -> bool:
        """Delete the entry of ``key`` if there is one (its files had the wrong digest)."""
        if not (self.root / key).exists():
            return False
        self._remove(self.root / key)
        return True

    def evict(self, *, keep: set[str]) -> list[str]:
        """Delete least recently used entries, except ``keep`` and in-use ones, down to the cap."""
        if self.max_bytes is None:
            return []
        protected = keep | self._marked_keys()
        entries = sorted(self._entries())
        total = sum(size for _, _, size in entries)
        evicted: list[str] = []
        for _, key, size in entries:
            if total <= self.max_bytes:
                break
            if key not in protected:
                self._remove(self.root / key)
                total -= size
                evicted.append(key)
        if evicted or total > self.max_bytes:
            log.info("lora.cache_evicted", evicted=evicted, total_bytes=total, cap=self.max_bytes)
        return evicted

    def mark_in_use(self, key: str) -> None:
        """Record that a loaded adapter of this process uses ``key`` (seen by every process)."""
        self._in_use.mkdir(parents=True, exist_ok=True)
        (self._in_use / f"{key}@{owner_tag()}").touch()

    def unmark_in_use(self, key: str) -> None:
        """Drop this process's in-use record of ``key``."""
        (self._in_use / f"{key}@{owner_tag()}").unlink(missing_ok=True)

    def _entries(self) -> list[tuple[int, str, int]]:
        found = []
        for path in self.root.iterdir():
            if not path.name.startswith(".") and path.is_dir() and not path.is_symlink():
                found.append((path.stat().st_mtime_ns, path.name, _tree_bytes(path)))
        return found

    def _marked_keys(self) -> set[str]:
        keys: set[str] = set()
        for marker in _children(self._in_use):
            key, _, owner = marker.name.partition("@")
            if owner_alive(owner):
                keys.add(key)
            else:
                marker.unlink(missing_ok=True)
        return keys

    def _remove(self, path: Path) -> None:
        self._trash.mkdir(parents=True, exist_ok=True)
        doomed = Path(tempfile.mkdtemp(prefix=f"{path.name}@", dir=self._trash))
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, doomed / path.name)
        shutil.rmtree(doomed, ignore_errors=True)

    def _sweep_once(self) -> None:
        """Create the layout and delete what dead processes left behind (once per object)."""
        with self._sweep_lock:
            if self._swept:
                return
            for folder in (self._tmp, self._trash, self._in_use):
                folder.mkdir(parents=True, exist_ok=True)
            for leftover in _children(self._tmp):
                if _abandoned(leftover):
                    shutil.rmtree(leftover, ignore_errors=True)
            for doomed in _children(self._trash):
                shutil.rmtree(doomed, ignore_errors=True)
            self._marked_keys()
            self._swept = True


def _touch(path: Path) -> None:
    """Mark ``path`` used now, at nanosecond resolution so that LRU order is exact."""
    now_ns = time.time_ns()
    os.utime(path, ns=(now_ns, now_ns))


def _abandoned(download_dir: Path) -> bool:
    """Whether a download directory's owner is dead, or it is a day old (other hosts)."""
    _, _, rest = download_dir.name.partition("@")
    owner = rest.rpartition("@")[0]
    try:
        age_s = time.time() - download_dir.stat().st_mtime
    except FileNotFoundError:
        return False
    return not owner_alive(owner) or age_s > FOREIGN_STALE_AGE_S


def _children(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except FileNotFoundError:
        return []


def _tree_bytes(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        total += sum(os.lstat(os.path.join(folder, name)).st_size for name in files)
    return total
