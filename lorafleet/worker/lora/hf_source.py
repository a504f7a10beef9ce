"""The ``hf://org/name[@revision]`` source: a Hugging Face Hub repository, via huggingface_hub.

``HF_ENDPOINT`` (a mirror or a private hub) and ``HF_TOKEN`` are read at each
download, so they may change while the worker runs. Blocking hub calls run in
a worker thread; hub errors are translated here, never quoted (they may carry
request headers). The repository's file listing is read first, at the commit the
revision names: every name must stay inside the adapter folder and the listed sizes
within ``DYN_LORA_MAX_BYTES`` before a file is fetched, and the download is pinned to
that commit so the files fetched are the files checked.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from lorafleet.proto.uris import split_uri
from lorafleet.worker.lora.archive import safe_join
from lorafleet.worker.lora.errors import (
    LoraInvalidUriError,
    LoraNotFoundError,
    LoraSourceError,
    LoraUnavailableError,
    adapter_too_big,
)

__all__ = ["HfSource", "parse_hf_uri"]

_REPO_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
HF_ETAG_TIMEOUT_S: Final = 30.0
HF_LOCAL_METADATA_DIR: Final = ".cache"
"""huggingface_hub's bookkeeping inside ``local_dir``; not part of the adapter, so dropped."""


def parse_hf_uri(uri: str) -> tuple[str, str | None]:
    """Split ``hf://org/name@rev`` into ``("org/name", "rev")`` (revision None when absent)."""
    rest = (split_uri(uri) or ("", ""))[1].strip("/")
    repo_id, _, revision = rest.partition("@")
    if not _REPO_ID.fullmatch(repo_id) or (revision == "" and "@" in rest):
        raise LoraInvalidUriError(
            uri, "not hf://org/name[@revision]", hint="e.g. hf://org/pirate-lora@main"
        )
    return repo_id, revision or None


class HfSource:
    """Downloads an adapter repository's files from the Hub (or ``HF_ENDPOINT``)."""

    name = "hf"
    bookkeeping = (HF_LOCAL_METADATA_DIR,)
    """Left out of the manager's size watch: huggingface_hub's files, removed on return."""

    def __init__(self, *, max_bytes: int | None = None) -> None:
        """``max_bytes`` bounds one adapter: the sum of its listed file sizes, before any GET."""
        self._max_bytes = max_bytes

    async def download(self, uri: str, dest: Path) -> Path:
        """Fetch the repository snapshot into ``dest`` and return ``dest``."""
        repo_id, revision = parse_hf_uri(uri)
        return await asyncio.to_thread(self._download_blocking, uri, repo_id, revision, dest)

    async def exists(self, uri: str) -> bool:
        """Return whether the repository (at the revision) exists for this token."""
        repo_id, revision = parse_hf_uri(uri)
        try:
            await asyncio.to_thread(self._info_blocking, uri, repo_id, revision)
        except LoraNotFoundError:
            return False
        return True

    def _download_blocking(self, uri: str, repo_id: str, revision: str | None, dest: Path) -> Path:
        hub = _hub(uri)
        endpoint, token = _endpoint(), _token()
        try:
            api = hub.HfApi(endpoint=endpoint, token=token)
            commit = api.model_info(repo_id, revision=revision).sha or revision
            tree = api.list_repo_tree(repo_id, recursive=True, revision=commit)
            self._check_listing(uri, [entry for entry in tree if _is_file(entry)], dest)
            hub.snapshot_download(
                repo_id, revision=commit, local_dir=dest, etag_timeout=HF_ETAG_TIMEOUT_S,
                endpoint=endpoint, token=token,
            )  # fmt: skip
        except Exception as exc:
            raise _translate(exc, uri) from exc
        shutil.rmtree(dest / HF_LOCAL_METADATA_DIR, ignore_errors=True)
        return dest

    def _check_listing(self, uri: str, files: Iterable[Any], dest: Path) -> None:
        """Refuse a listing whose names leave ``dest`` or whose sizes pass the bound."""
        listed = 0
        for entry in files:
            safe_join(dest, entry.path, uri=uri)
            listed += int(entry.size or 0)
        if self._max_bytes is not None and listed > self._max_bytes:
            raise adapter_too_big(uri, listed, self._max_bytes)

    def _info_blocking(self, uri: str, repo_id: str, revision: str | None) -> None:
        hub = _hub(uri)
        try:
            hub.HfApi(endpoint=_endpoint(), token=_token()).model_info(repo_id, revision=revision)
        except Exception as exc:
            raise _translate(exc, uri) from exc


def _hub(uri: str) -> ModuleType:
    try:
        import huggingface_hub
    except ImportError as exc:
        raise LoraUnavailableError(
            uri, "huggingface_hub is not installed", hint="install lorafleet[hf]"
        ) from exc
    return huggingface_hub


def _is_file(entry: Any) -> bool:
    """Whether a hub tree entry is a file (``RepoFile``; folders have no size)."""
    from huggingface_hub.hf_api import RepoFile

    return isinstance(entry, RepoFile)


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or None


def _token() -> str | None:
    return os.environ.get("HF_TOKEN", "").strip() or None


def _translate(exc: Exception, uri: str) -> LoraSourceError:
    """A hub exception as our error: its class and HTTP status only, never its text."""
    from huggingface_hub import errors

    where = f"hub {_endpoint() or 'https://huggingface.co'}"
    if isinstance(exc, LoraSourceError):
        return exc
    if isinstance(exc, errors.GatedRepoError):
        return LoraUnavailableError(
            uri, f"{where} refused access to a gated repository", hint="check HF_TOKEN"
        )
    if isinstance(exc, (errors.RepositoryNotFoundError, errors.RevisionNotFoundError)):
        return LoraNotFoundError(
            uri, f"{where} has no such repository or revision", hint="check the name and HF_TOKEN"
        )
    if isinstance(exc, errors.EntryNotFoundError):
        return LoraNotFoundError(uri, f"{where} lacks a listed file", hint="check the repository")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    detail = f"HTTP {status}" if status else type(exc).__name__
    return LoraUnavailableError(
        uri, f"{where} failed ({detail})", hint="check HF_ENDPOINT, HF_TOKEN and the network"
    )
