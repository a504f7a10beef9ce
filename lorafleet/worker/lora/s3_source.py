"""The ``s3://bucket/prefix`` source: every object under the prefix, fetched with boto3.

Endpoint, region and credentials come from the standard AWS environment and
config files (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_PROFILE``, ...), read
by boto3 itself, plus Dynamo's ``AWS_ENDPOINT`` and ``AWS_ALLOW_HTTP``. Every
blocking call runs in a worker thread. boto3 errors are translated here; their
text (which may quote request details) never reaches logs or messages, only
the S3 error code does.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeAlias

from lorafleet.fleet.adapter_files import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from lorafleet.proto.uris import split_uri
from lorafleet.worker.lora._budget import ByteBudget
from lorafleet.worker.lora.archive import extract_archive, is_archive_name, safe_join
from lorafleet.worker.lora.errors import (
    LoraInvalidAdapterError,
    LoraInvalidUriError,
    LoraNotFoundError,
    LoraSourceError,
    LoraUnavailableError,
    is_local_disk_error,
)
from lorafleet.worker.lora.s3_errors import translate_s3_error

__all__ = [
    "InsecureEndpointError",
    "S3ClientFactory",
    "S3Source",
    "default_s3_client",
    "dynamo_endpoint",
    "parse_s3_uri",
]

S3_MAX_OBJECTS: Final = 1000
S3_CONNECT_TIMEOUT_S: Final = 10.0
S3_READ_TIMEOUT_S: Final = 60.0
S3_MAX_ATTEMPTS: Final = 3
ARCHIVE_FILE_NAME: Final = ".lorafleet-archive"

S3ClientFactory: TypeAlias = Callable[[], Any]
"""Builds a boto3 S3 client; called once, lazily, in a worker thread."""


class InsecureEndpointError(ValueError):
    """``AWS_ENDPOINT`` is plain ``http://`` while ``AWS_ALLOW_HTTP`` is not true."""


def dynamo_endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """Dynamo's ``AWS_ENDPOINT``, used when boto3's ``AWS_ENDPOINT_URL(_S3)`` is unset.

    As in Dynamo (object_store), an ``http://`` endpoint needs ``AWS_ALLOW_HTTP=true``.
    """
    env = os.environ if environ is None else environ
    if env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"):
        return None
    endpoint = env.get("AWS_ENDPOINT", "").strip()
    if not endpoint:
        return None
    allow_http = env.get("AWS_ALLOW_HTTP", "").strip().lower() in ("1", "true", "yes")
    if endpoint.lower().startswith("http://") and not allow_http:
        raise InsecureEndpointError(
            f"AWS_ENDPOINT {endpoint} is plain http; set AWS_ALLOW_HTTP=true to allow it"
        )
    return endpoint


def default_s3_client() -> Any:
    """Return a boto3 S3 client configured from the standard AWS environment."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=S3_CONNECT_TIMEOUT_S,
        read_timeout=S3_READ_TIMEOUT_S,
        retries={"mode": "standard", "max_attempts": S3_MAX_ATTEMPTS},
    )
    endpoint = dynamo_endpoint()
    return boto3.session.Session().client("s3", config=config, endpoint_url=endpoint)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Split ``s3://bucket/prefix`` into the bucket and the key prefix (taken verbatim)."""
    scheme, rest = split_uri(uri) or ("", "")
    bucket, _, prefix = rest.partition("/")
    if scheme != "s3" or not bucket or any(c in bucket for c in "@:?#"):
        raise LoraInvalidUriError(uri, "not an S3 URI", hint="write s3://bucket/prefix")
    return bucket, prefix


class S3Source:
    """Downloads the adapter under an S3 prefix (or one archive object) through boto3."""

    name = "s3"
    bookkeeping = (ARCHIVE_FILE_NAME,)
    """The downloaded archive is not the adapter: it goes once extracted, and is bounded
    on its own (its contents are bounded apart from it)."""

    def __init__(
        self, *, client_factory: S3ClientFactory = default_s3_client, max_bytes: int | None = None
    ) -> None:
        """``max_bytes`` bounds one adapter: its listed size before any GET, then its stream."""
        self._client_factory = client_factory
        self._max_bytes = max_bytes
        self._client: Any = None
        self._client_lock = threading.Lock()

    async def download(self, uri: str, dest: Path) -> Path:
        """Fetch every object under the prefix into ``dest`` and return ``dest``.

        Cancelled (a timeout, the manager's size watch), its thread stops at its next
        chunk and removes what it wrote: a thread cannot be cancelled, and would otherwise
        go on writing after the manager removed ``dest``.
        """
        cancelled = threading.Event()
        try:
            download = self._download_blocking
            return await asyncio.to_thread(self._guarded, download, uri, dest, cancelled)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def version_tag(self, uri: str) -> str:
        """A hash of the objects' keys, ETags and sizes under the prefix (one listing), or of
        the archive's ETag and size (one HEAD): another upload of other bytes changes it."""
        return await asyncio.to_thread(self._guarded, self._version_tag_blocking, uri)

    async def exists(self, uri: str) -> bool:
        """Return whether at least one object lies under the prefix."""
        return await asyncio.to_thread(self._guarded, self._exists_blocking, uri)

    def _guarded(self, call: Callable[..., Any], uri: str, *args: Any) -> Any:
        try:
            return call(uri, *args)
        except LoraSourceError:
            raise
        except Exception as exc:
            if is_local_disk_error(exc):
                raise  # the cache's disk, not S3: the manager says so
            raise translate_s3_error(exc, uri, endpoint=self._endpoint()) from exc

    def _client_or_new(self, uri: str) -> Any:
        with self._client_lock:
            if self._client is None:
                try:
                    self._client = self._client_factory()
                except ImportError as exc:
                    raise LoraUnavailableError(
                        uri, "boto3 is not installed", hint="install lorafleet[s3]"
                    ) from exc
                except InsecureEndpointError as exc:
                    raise LoraUnavailableError(
                        uri, "AWS_ENDPOINT is plain http", hint=str(exc)
                    ) from exc
            return self._client

    def _endpoint(self) -> str:
        client = self._client
        return str(client.meta.endpoint_url) if client is not None else "(not created)"

    def _exists_blocking(self, uri: str) -> bool:
        bucket, prefix = parse_s3_uri(uri)
        try:
            found = self._client_or_new(uri).list_objects_v2(
                Bucket=bucket, Prefix=prefix, MaxKeys=1
            )
        except Exception as exc:
            error = translate_s3_error(exc, uri, endpoint=self._endpoint())
            if isinstance(error, LoraNotFoundError):
                return False
            raise error from exc
        return int(found.get("KeyCount", 0)) > 0

    def _version_tag_blocking(self, uri: str) -> str:
        bucket, prefix = parse_s3_uri(uri)
        client = self._client_or_new(uri)
        if is_archive_name(prefix):
            head = client.head_object(Bucket=bucket, Key=prefix)
            listed = [_Object(prefix, int(head["ContentLength"]), str(head.get("ETag", "")))]
        else:
            listed = _list_objects(client, bucket, _folder(prefix), uri)
        lines = sorted(f"{item.key}\0{item.etag}\0{item.size}" for item in listed)
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()

    def _download_blocking(self, uri: str, dest: Path, cancelled: threading.Event) -> Path:
        try:
            return self._fetch_blocking(
                uri, dest, ByteBudget(uri, self._max_bytes, cancelled=cancelled)
            )
        finally:
            if cancelled.is_set():
                shutil.rmtree(dest, ignore_errors=True)

    def _fetch_blocking(self, uri: str, dest: Path, budget: ByteBudget) -> Path:
        bucket, prefix = parse_s3_uri(uri)
        client = self._client_or_new(uri)
        if is_archive_name(prefix):
            budget.check(int(client.head_object(Bucket=bucket, Key=prefix)["ContentLength"]))
            return _fetch_archive(client, bucket, prefix, dest, uri, budget)
        prefix = _folder(prefix)
        listed = {
            item.key: item.size
            for item in _list_objects(client, bucket, prefix, uri)
            if not item.key.endswith("/")
        }
        budget.check(sum(listed.values()))
        for key, target in self._plan(listed, prefix, dest, uri):
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, key, str(target), Config=_single_stream(), Callback=budget)
        return dest

    def _plan(
        self, keys: Collection[str], prefix: str, dest: Path, uri: str
    ) -> list[tuple[str, Path]]:
        """Map each key to its file, refusing unsafe or non-adapter sets."""
        if not keys:
            raise LoraNotFoundError(
                uri,
                "no objects under this prefix",
                hint="check the bucket and prefix (case matters)",
            )
        plan = [(key, safe_join(dest, key[len(prefix) :], uri=uri)) for key in keys]
        names = {key[len(prefix) :] for key in keys}
        if ADAPTER_CONFIG not in names or not names.intersection(ADAPTER_WEIGHTS):
            raise LoraInvalidAdapterError(
                uri,
                f"the prefix holds no {ADAPTER_CONFIG} with adapter weights next to it",
                hint="point the URI at the prefix where the PEFT adapter was uploaded",
            )
        return plan


def _single_stream() -> Any:
    """Return a transfer config of one GET per object, in the calling (worker) thread.

    s3transfer's default ten threads starve the event loop of the GIL: worst loop
    lag 0.3-0.6 s against 0.03-0.1 s while fetching a 64 MiB adapter (2 cores).
    """
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(use_threads=False)


class _Object(NamedTuple):
    """One object as a listing (or a HEAD) shows it."""

    key: str
    size: int
    etag: str


def _folder(prefix: str) -> str:
    """The prefix as a folder (``a/b`` lists ``a/b/...``, not ``a/bc``)."""
    return prefix + "/" if prefix and not prefix.endswith("/") else prefix


def _list_objects(client: Any, bucket: str, prefix: str, uri: str) -> list[_Object]:
    """Every object under ``prefix``, refusing more objects than an adapter has."""
    keys: list[_Object] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(
            _Object(item["Key"], int(item.get("Size", 0)), str(item.get("ETag", "")))
            for item in page.get("Contents", ())
        )
        if len(keys) > S3_MAX_OBJECTS:
            raise LoraInvalidAdapterError(
                uri,
                f"more than {S3_MAX_OBJECTS} objects under this prefix",
                hint="point the URI at a single adapter's prefix",
            )
    return keys


def _fetch_archive(
    client: Any, bucket: str, key: str, dest: Path, uri: str, budget: ByteBudget
) -> Path:
    """Download one archive object and extract it; a single top folder becomes the adapter.
    The archive and its contents are each bounded by ``budget``'s bound."""
    archive = dest / ARCHIVE_FILE_NAME
    client.download_file(bucket, key, str(archive), Config=_single_stream(), Callback=budget)
    extract_archive(archive, dest, uri=uri, budget=budget.fresh())
    archive.unlink()
    children = list(dest.iterdir())
    if not (dest / ADAPTER_CONFIG).exists() and len(children) == 1 and children[0].is_dir():
        return children[0]
    return dest
