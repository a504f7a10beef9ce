"""An adapter whose rank nobody can read before loading it (an ``s3://`` source, on a moto
server): placement learns it from the first refusal and never asks that worker again.

Real mocker workers (``--max-lora-rank`` 8 and 64), etcd's desired state, a real S3 API.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec

from lorafleet.discovery.keys import adapter_key
from lorafleet.proto.adapters import AdapterSpec, LoraSource
from lorafleet.proto.naming import lora_slug
from tests.worker.fleet import instance_id, load_records, put_spec, wait_for_holders
from tests.worker.lora.conftest import adapter_files

REFUSED = re.compile(r'lorafleet_worker_adapter_operations_total\{operation="load",'
                     r'outcome="adapter_rank_too_large"\} (\S+)')  # fmt: skip


def _refusals(url: str) -> float:
    found = REFUSED.search(httpx.get(f"{url}/metrics").text)
    return float(found.group(1)) if found else 0.0


async def test_a_rank_refused_once_moves_the_adapter_and_is_never_tried_there_again(
    worker_factory, etcd, namespace, tmp_path: Path, aws_env: Any, upload: Callable[..., str]
) -> None:
    env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
    small, large = [
        await asyncio.to_thread(worker_factory, "--enable-lora", "--max-lora-rank", str(rank),
                                env=env)
        for rank in (8, 64)
    ]  # fmt: skip
    small_id, large_id = await instance_id(small), await instance_id(large)
    uri = upload("wide", adapter_files(rank=32, base="demo"))
    spec = AdapterSpec(name="wide", base_model="demo", source=LoraSource(uri=uri), replicas="all")
    await etcd.put(adapter_key(namespace, lora_slug("wide")).encode(), msgspec.json.encode(spec))
    await wait_for_holders(etcd, namespace, lambda w, _b: w.get("wide") == {large_id}, 30)

    # more passes of placement: another adapter placed everywhere after the refusal
    await put_spec(etcd, namespace, tmp_path / "adapters", "narrow", replicas="all")
    await wait_for_holders(
        etcd, namespace, lambda w, _b: w.get("narrow") == {small_id, large_id}, 30
    )
    records = await load_records(etcd, namespace)
    refusal = records[small_id].failed["wide"]
    assert (refusal.code, refusal.attempts) == ("adapter_rank_too_large", 1)
    assert _refusals(small.url) == 1.0 and _refusals(large.url) == 0.0
