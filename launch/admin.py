"""``lorafleet lora ...`` and ``lorafleet models``: talk to a running cluster over HTTP.

Adapter commands reach every worker of a namespace (found in etcd) or the
one given with ``--worker``; ``models`` asks a frontend.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import httpx

from discovery.client import connect_etcd
from discovery.keys import instance_prefix
from proto.discovery import decode_instance

__all__ = ["discover", "list_models", "lora_command", "worker_urls"]


async def worker_urls(etcd_endpoints: str, namespace: str) -> list[str]:
    """System URLs of every live worker in ``namespace``."""
    etcd = await connect_etcd(etcd_endpoints)
    try:
        listing = await etcd.get_prefix(instance_prefix(namespace).encode())
    finally:
        await etcd.close()
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


def list_models(frontend_url: str) -> int:
    """Print the frontend's ``/v1/models`` as a table."""
    try:
        response = httpx.get(f"{frontend_url}/v1/models", timeout=10)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"cannot list models at {frontend_url}: {exc}")
        return 1
    rows = [(m["id"], m.get("parent") or "-") for m in response.json()["data"]]
    width = max([len("MODEL"), *(len(model) for model, _ in rows)])
    print(f"{'MODEL':<{width}}  PARENT")
    for model, parent in rows:
        print(f"{model:<{width}}  {parent}")
    return 0


def discover(etcd_endpoints: str, namespace: str) -> list[str]:
    """Synchronous wrapper of ``worker_urls`` for the CLI."""
    return asyncio.run(worker_urls(etcd_endpoints, namespace))
