"""``lorafleet lora ...`` and ``lorafleet models``: talk to a running cluster over HTTP.

``load``/``unload``/``list`` reach every worker of a namespace (found in etcd)
or the one given with ``--worker``; ``apply``/``delete`` write the fleet's
desired state through a frontend's ``/v1/adapters`` (``apply`` then waits for
the adapter's state, ``launch.fleet_status``); ``models`` asks a frontend.
Bodies are the ``proto`` Structs the servers decode; lists print as tables, or as
JSON lines with ``--json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import msgspec

from lorafleet.discovery.client import connect_etcd
from lorafleet.discovery.connect import wait_for_etcd
from lorafleet.discovery.keys import instance_prefix, load_prefix, parse_load_key
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.launch.fleet_status import (
    DEFAULT_APPLY_WAIT_S,
    admin_token_header,
    describe,
    settled_status,
)
from lorafleet.launch.table import print_table
from lorafleet.proto.adapters import (
    AdapterSpec,
    ListLorasRequest,
    LoadLoraRequest,
    LoraSource,
    UnloadLoraRequest,
)
from lorafleet.proto.discovery import Instance, decode_instance
from lorafleet.proto.fleet_load import InstanceLoad, decode_instance_load

__all__ = [
    "admin_headers",
    "admin_request",
    "apply_adapter",
    "delete_adapter",
    "discover",
    "instances",
    "list_models",
    "load_records",
    "lora_command",
    "worker_urls",
]

_LoraRequest = LoadLoraRequest | UnloadLoraRequest | ListLorasRequest


async def _listed(etcd: EtcdSettings, prefix: str, wait_s: float = 0) -> list[tuple[str, bytes]]:
    """Every key under ``prefix`` and its value, read once; ``wait_s``: how long to wait for
    etcd to answer (0: one try)."""
    etcd_client = await (wait_for_etcd(etcd, timeout_s=wait_s) if wait_s else connect_etcd(etcd))
    try:
        listing = await etcd_client.get_prefix(prefix.encode())
    finally:
        await etcd_client.close()
    return [(kv.key.decode(), kv.value) for kv in listing]


async def instances(etcd: EtcdSettings, namespace: str, wait_s: float = 0) -> list[Instance]:
    """Every live worker instance registered in ``namespace`` (``wait_s``: see ``_listed``)."""
    listed = await _listed(etcd, instance_prefix(namespace), wait_s)
    return [decode_instance(value) for _key, value in listed]


async def load_records(etcd: EtcdSettings, namespace: str) -> dict[int, InstanceLoad]:
    """Every live worker's load record in ``namespace``, by instance id (a record that does
    not decode is left out)."""
    records = {}
    for key, value in await _listed(etcd, load_prefix(namespace)):
        with contextlib.suppress(ValueError, msgspec.DecodeError, msgspec.ValidationError):
            records[parse_load_key(key)[1]] = decode_instance_load(value)
    return records


async def worker_urls(etcd: EtcdSettings, namespace: str) -> list[str]:
    """System URLs of every live worker in ``namespace``."""
    return sorted({instance.system_url for instance in await instances(etcd, namespace)})


def lora_command(
    action: str, *, name: str | None, uri: str | None, workers: list[str], as_json: bool = False,
    sha256: str | None = None, replace: bool = False,
) -> int:  # fmt: skip
    """Run ``load`` (of files with the content digest ``sha256``, when given; a swap from
    another source when ``replace``), ``unload`` or ``list`` on each worker; print a table
    (or JSON lines)."""
    if not workers:
        print("no live worker found; is the cluster up (lorafleet up)?")
        return 1
    token = os.environ.get("DYN_SYSTEM_AUTH_TOKEN")
    headers = {"Authorization": f"Bearer {token}", **_JSON} if token else _JSON
    path, request = _route(action, name, LoraSource(uri=uri or "", sha256=sha256), replace)
    answers: list[dict[str, Any]] = []
    for url in workers:
        try:
            response = httpx.post(f"{url}{path}", content=msgspec.json.encode(request),
                                  headers=headers, timeout=300)  # fmt: skip
            answer = {"worker": url, "ok": response.status_code == 200, **response.json()}
        except (httpx.HTTPError, ValueError) as exc:
            answer = {"worker": url, "ok": False, "status": "error", "message": f"{exc}"}
        answers.append(answer)
    _print_lora_answers(action, answers, as_json=as_json)
    return 0 if all(answer["ok"] for answer in answers) else 1


_JSON = {"Content-Type": "application/json"}


def _route(
    action: str, name: str | None, source: LoraSource, replace: bool
) -> tuple[str, _LoraRequest]:
    if action == "load":
        load = LoadLoraRequest(lora_name=name or "", source=source, replace=replace)
        return "/engine/update/load_lora", load
    if action == "unload":
        return "/engine/update/unload_lora", UnloadLoraRequest(lora_name=name or "")
    return "/engine/update/list_loras", ListLorasRequest()


def _print_lora_answers(action: str, answers: list[dict[str, Any]], *, as_json: bool) -> None:
    if as_json:
        for answer in answers:
            print(json.dumps({key: value for key, value in answer.items() if key != "ok"}))
        return
    rows: list[tuple[str, ...]] = []
    for answer in answers:
        if action == "list" and answer["ok"]:
            loras = answer.get("loras", {})
            rows += [(answer["worker"], name, str(lid)) for name, lid in sorted(loras.items())]
            rows += [] if loras else [(answer["worker"], "-", "-")]
        elif action == "list":
            rows.append((answer["worker"], "error", answer.get("message", "")))
        else:
            rows.append((answer["worker"], answer.get("status", "error"),
                         answer.get("message", "")))  # fmt: skip
    header = ("WORKER", "ADAPTER", "ID") if action == "list" else ("WORKER", "STATUS", "MESSAGE")
    print_table(header, rows)


def admin_headers() -> dict[str, str]:
    """JSON headers with ``DYN_ADMIN_TOKEN`` as the bearer token when it is set."""
    return {**admin_token_header(), **_JSON}


def admin_request(
    method: str, url: str, body: bytes | None = None, *, show: Callable[[Any], None] | None = None
) -> int:
    """Send one admin request to a frontend and print the error, its JSON answer, or
    ``show(answer)`` for a 2xx answer when ``show`` is given; 0 on a 2xx status."""
    try:
        response = httpx.request(method, url, content=body, headers=admin_headers(), timeout=30)
        answer: Any = response.json() if response.content else {}
    except (httpx.HTTPError, ValueError) as exc:
        print(json.dumps({"status": "error", "message": f"{url}: {exc}"}))
        return 1
    if response.is_success and show is not None:
        show(answer)
    else:
        print(json.dumps(answer))
    return 0 if response.is_success else 1


def apply_adapter(
    frontend_url: str, adapter: AdapterSpec, *, wait_s: float = DEFAULT_APPLY_WAIT_S,
    as_json: bool = False,
) -> int:  # fmt: skip
    """``POST /v1/adapters``, then wait up to ``wait_s`` for the adapter to leave ``pending``
    and ``loading``; print its state (JSON with ``as_json``); 1 when refused or failed."""
    url = f"{frontend_url}/v1/adapters"
    try:
        response = httpx.post(url, content=msgspec.json.encode(adapter),
                              headers=admin_headers(), timeout=30)  # fmt: skip
        answer: Any = response.json()
        if response.is_success:
            answer = settled_status(frontend_url, answer, wait_s)
    except (httpx.HTTPError, ValueError) as exc:
        print(json.dumps({"status": "error", "message": f"{url}: {exc}"}))
        return 1
    if not response.is_success:
        print(json.dumps(answer))
        return 1
    print(json.dumps(answer) if as_json else describe(answer, wait_s))
    return 1 if answer.get("state") == "failed" else 0


def delete_adapter(frontend_url: str, name: str) -> int:
    """``DELETE /v1/adapters/{name}``: remove the adapter from the desired state."""
    return admin_request("DELETE", f"{frontend_url}/v1/adapters/{quote(name)}")


def list_models(frontend_url: str, *, as_json: bool = False) -> int:
    """Print the frontend's ``/v1/models`` as a table (or its JSON)."""
    try:
        response = httpx.get(f"{frontend_url}/v1/models", timeout=10)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"cannot list models at {frontend_url}: {exc}")
        return 1
    if as_json:
        print(json.dumps(response.json()))
        return 0
    rows = [
        (m["id"], m.get("parent") or "-", "loaded" if m.get("loaded", True) else "cold")
        for m in response.json()["data"]
    ]
    print_table(("MODEL", "PARENT", "STATE"), rows)
    return 0


def discover(etcd: EtcdSettings, namespace: str) -> list[str]:
    """Synchronous wrapper of ``worker_urls`` for the CLI."""
    return asyncio.run(worker_urls(etcd, namespace))
