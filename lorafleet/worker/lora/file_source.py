"""The ``file://`` source: adapters already on the worker's disk, validated and used in place.

It never copies: the engine reads the adapter from where it lies. With allowed
roots (``DYN_LORA_FILE_ROOTS``) a path outside them is refused before anything
about it (even whether it exists) is revealed, and so is an adapter directory
holding a symbolic link (to a file or a folder) that leads outside them: its
files are not read, and the answer does not say where the link leads. With or
without roots, a directory holding a device, a FIFO or a socket (or a link to one)
is refused: an engine reading it would block or read without end.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from lorafleet.fleet.adapter_files import ADAPTER_CONFIG, adapter_problem
from lorafleet.worker.lora.errors import (
    LoraInvalidAdapterError,
    LoraInvalidUriError,
    LoraNotFoundError,
)

__all__ = ["ADAPTER_DIR_ENTRIES_MAX", "ESCAPE_HINT", "FileSource", "file_uri_path"]

ADAPTER_DIR_ENTRIES_MAX: Final = 10_000
"""Entries checked for escaping links before giving up; a PEFT adapter holds a handful."""
ESCAPE_HINT: Final = (
    "put the adapter's own files (or links that stay inside DYN_LORA_FILE_ROOTS) in its directory"
)

PLAIN_FILES_HINT: Final = "an adapter directory may hold only regular files and folders"

NAME_MAX_BYTES: Final = 255
PATH_MAX_BYTES: Final = 4096
"""Linux's limits on a path's components and whole; longer paths are the caller's mistake
(the file system would answer ENAMETOOLONG, which is no outage)."""


def file_uri_path(uri: str) -> Path:
    """Return the absolute path named by a ``file:///abs/path`` URI (percent-decoded)."""
    try:
        parts = urlsplit(uri)
    except ValueError as exc:  # e.g. an unclosed "[" of an IPv6 host
        raise LoraInvalidUriError(uri, f"not a file URI ({exc})") from None
    if parts.scheme.lower() != "file" or parts.netloc not in ("", "localhost"):
        raise LoraInvalidUriError(
            uri, "a file URI names no host", hint="write file:///absolute/path (three slashes)"
        )
    path = unquote(parts.path)
    if parts.query or parts.fragment or not path.startswith("/") or "\0" in path:
        raise LoraInvalidUriError(
            uri,
            "not an absolute file path",
            hint="write file:///absolute/path and percent-encode '?' and '#'",
        )
    if _too_long(path):
        raise LoraInvalidUriError(
            uri,
            "the path is too long for a file system",
            hint=f"at most {PATH_MAX_BYTES} bytes, {NAME_MAX_BYTES} per component",
        )
    return Path(path)


def _too_long(path: str) -> bool:
    encoded = os.fsencode(path)
    return len(encoded) >= PATH_MAX_BYTES or any(
        len(part) > NAME_MAX_BYTES for part in encoded.split(b"/")
    )


def _is_special(entry: Path) -> bool:
    """Whether ``entry`` (followed if a link; a dangling link is not) is neither a regular
    file nor a folder."""
    try:
        mode = entry.stat().st_mode
    except OSError:
        return False  # a dangling link: nothing can be read through it
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


class FileSource:
    """Resolves ``file://`` URIs to validated local directories, optionally under allowed roots."""

    name = "file"

    def __init__(self, *, roots: tuple[Path, ...] = ()) -> None:
        self._roots = tuple(root.expanduser().resolve() for root in roots)

    def local_path(self, uri: str) -> Path:
        """Return the resolved adapter directory of ``uri``; raise why it cannot be used."""
        resolved = file_uri_path(uri).resolve()
        if self._roots and not self._within_roots(resolved):
            raise LoraInvalidUriError(
                uri, "the path is outside the allowed roots", hint=self._roots_hint()
            )
        if not resolved.exists():
            raise LoraNotFoundError(
                uri, "no such file or directory", hint="the path is read on the worker's host"
            )
        if not resolved.is_dir():
            raise LoraInvalidAdapterError(
                uri,
                "not a directory",
                hint=f"point the URI at the directory that holds {ADAPTER_CONFIG}",
            )
        self._check_entries(uri, resolved)
        problem = adapter_problem(resolved)
        if problem is not None:
            raise LoraInvalidAdapterError(uri, problem, hint="save the adapter with PEFT")
        return resolved

    def _within_roots(self, resolved: Path) -> bool:
        return any(resolved.is_relative_to(root) for root in self._roots)

    def _roots_hint(self) -> str:
        roots = ", ".join(str(root) for root in self._roots)
        return f"place the adapter under one of DYN_LORA_FILE_ROOTS ({roots})"

    def _check_entries(self, uri: str, directory: Path) -> None:
        """Raise ``LoraInvalidAdapterError`` if an entry of ``directory`` is a special file, or
        (with roots; links inside them are followed) resolves outside the roots."""
        seen: set[Path] = set()
        entries = 0
        for current, dirnames, filenames in os.walk(directory, followlinks=bool(self._roots)):
            if (real := Path(current).resolve()) in seen:
                dirnames.clear()  # a link back to a folder already checked
                continue
            seen.add(real)
            for name in (*dirnames, *filenames):
                entries += 1
                entry = Path(current, name)
                member = entry.relative_to(directory).as_posix()
                if entries > ADAPTER_DIR_ENTRIES_MAX:
                    reason = f"the directory holds more than {ADAPTER_DIR_ENTRIES_MAX} entries"
                    raise LoraInvalidAdapterError(uri, reason, hint=ESCAPE_HINT)
                if self._roots and not self._within_roots(entry.resolve()):
                    reason = f"{member} is a symbolic link that leads outside the allowed roots"
                    raise LoraInvalidAdapterError(uri, reason, hint=ESCAPE_HINT)
                if _is_special(entry):
                    reason = f"{member} is a device, FIFO or socket"
                    raise LoraInvalidAdapterError(uri, reason, hint=PLAIN_FILES_HINT)

    async def download(self, uri: str, dest: Path) -> Path:
        """Return the adapter's own directory (outside ``dest``): it is used in place."""
        return await asyncio.to_thread(self.local_path, uri)

    async def exists(self, uri: str) -> bool:
        """Return whether the path exists (and, with roots, lies under one)."""
        try:
            await asyncio.to_thread(self.local_path, uri)
        except LoraInvalidAdapterError:
            return True
        except (LoraInvalidUriError, LoraNotFoundError):
            return False
        return True
