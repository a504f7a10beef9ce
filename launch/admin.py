"""``lorafleet lora ...`` and ``lorafleet models``: talk to a running cluster over HTTP.

``load``/``unload``/``list`` reach every worker of a namespace (found in etcd)
or the one given with ``--worker``; ``apply``/``delete`` write the fleet's
desired state through a frontend's ``/v1/adapters``; ``models`` asks a frontend.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from discovery.client import connect_etcd
from discovery.keys import instance_prefix
from discovery.settings import EtcdSettings
from proto.discovery import decode_instance

__all__ = [
    "AdapterApply",
    "apply_adapter",
    "delete_adapter",
    "discover",
    "list_models",
    "lora_command",
    "worker_urls",
]


async def worker_urls(etcd: EtcdSettings, namespace: str) -> list[str]:
    """System URLs of every live worker in ``namespace``."""
    etcd_client = await connect_etcd(etcd)
    try:
        listing = await etcd_client.get_prefix(instance_prefix(namespace).encode())
    finally:
        await etcd_client.close()
    return sorted({decode_instance(kv.value).system_url for kv in listing})


def lora_command(action: str, *, name: str | None, uri: str | None, workers: list[str]) -> int:
    """Run ``load``, ``unload`` or ``list`` on each worker; print each answer as JSON."""
    if not workers:
        print("no live worker found; is the cluster up (lorafleet up)?")
        return 1
    token = os.environ.get("DYN_SYSTEM_AUTH_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    path, body = _route(action, name, uri)
    failed = False
    for url in workers:
        try:
            response = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=300)
            answer: Any = response.json()
            failed |= response.status_code != 200
        except (httpx.HTTPError, ValueError) as exc:
            answer, failed = {"status": "error", "message": f"{url}: {exc}"}, True
        print(json.dumps({"worker": url, **answer}))
    return 1 if failed else 0


def _route(action: str, name: str | None, uri: str | None) -> tuple[str, dict[str, Any]]:
    if action == "load":
        return "/engine/update/load_lora", {"lora_name": name, "source": {"uri": uri}}
    if action == "unload":
        return "/engine/update/unload_lora", {"lora_name": name}
    return "/engine/update/list_loras", {}


@dataclass(frozen=True, kw_only=True)
class AdapterApply:
    """What ``lorafleet lora apply`` stores as an adapter's desired state."""

    name: str
    uri: str
    base_model: str
    replicas: int | str = 1
    pinned: bool = False


def _admin_headers() -> dict[str, str]:
    token = os.environ.get("DYN_ADMIN_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def _print_answer(method: str, url: str, body: dict[str, Any] | None = None) -> int:
    """Send one admin request to a frontend, print its JSON answer; 0 on a 2xx status."""
    try:
        response = httpx.request(method, url, json=body, headers=_admin_headers(), timeout=30)
        answer: Any = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        print(json.dumps({"status": "error", "message": f"{url}: {exc}"}))
        return 1
    print(json.dumps(answer))
    return 0 if response.is_success else 1


def apply_adapter(frontend_url: str, adapter: AdapterApply) -> int:
    """``POST /v1/adapters``: create or update the adapter's desired state."""
    body = {
        "name": adapter.name, "base_model": adapter.base_model,
        "source": {"uri": adapter.uri}, "replicas": adapter.replicas, "pinned": adapter.pinned,
    }  # fmt: skip
    return _print_answer("POST", f"{frontend_url}/v1/adapters", body)


def delete_adapter(frontend_url: str, name: str) -> int:
    """``DELETE /v1/adapters/{name}``: remove the adapter from the desired state."""
    return _print_answer("DELETE", f"{frontend_url}/v1/adapters/{quote(name)}")


def list_models(frontend_url: str) -> int:
    """Print the frontend's ``/v1/models`` as a table."""
    try:
        response = httpx.get(f"{frontend_url}/v1/models", timeout=10)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"cannot list models at {frontend_url}: {exc}")
        return 1
    rows = [
        (m["id"], m.get("parent") or "-", "loaded" if m.get("loaded", True) else "cold")
        for m in response.json()["data"]
    ]
    width = max([len("MODEL"), *(len(model) for model, _, _ in rows)])
    parent_width = max([len("PARENT"), *(len(parent) for _, parent, _ in rows)])
    print(f"{'MODEL':<{width}}  {'PARENT':<{parent_width}}  STATE")
    for model, parent, state in rows:
        print(f"{model:<{width}}  {parent:<{parent_width}}  {state}")
    return 0


def discover(etcd: EtcdSettings, namespace: str) -> list[str]:
    """Synchronous wrapper of ``worker_urls`` for the CLI."""
    return asyncio.run(worker_urls(etcd, namespace))
