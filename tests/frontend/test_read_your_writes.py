"""Read your writes: once a load answered 200, a chat to the adapter through any frontend works.

Two frontends in the test's event loop share real etcd, NATS and mocker workers;
frontend B reaches etcd through a proxy that forwards every byte half a second
late, so its watches lag behind etcd as a loaded or distant frontend's do. A
name B does not know yet must not be a 404 before B's watches reached etcd's
revision.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from tests.faults import TcpProxy
from tests.frontend.conftest import FAST_DISPATCH, run_frontend, wait_for_models
from tests.worker.adapters import make_adapter_dir

pytestmark = pytest.mark.slow

LINK_DELAY_S = 0.5
"""How late frontend B hears from etcd: far more than a chat right after a load takes."""


@pytest.fixture
async def two_frontends(etcd_url: str, nats_url: str, namespace: str):
    """Frontend A on etcd directly, frontend B behind a proxy that can slow its etcd link."""
    proxy = await TcpProxy(urlsplit(etcd_url).port or 2379).start()

    def config(etcd: str) -> FrontendConfig:
        return FrontendConfig(namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd),
                              nats_server=nats_url, dispatch=FAST_DISPATCH)  # fmt: skip

    async with run_frontend(config(etcd_url)) as a, run_frontend(config(proxy.url)) as b:
        yield a, b, proxy
    await proxy.aclose()


async def _chat(url: str, model: str) -> str:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    answer = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return answer.model


async def test_a_vllm_load_answered_by_one_frontend_is_served_at_once_by_another(
    lora_workers, two_frontends, tmp_path: Path
) -> None:
    a, b, proxy = two_frontends
    await asyncio.to_thread(lora_workers, 1)
    await wait_for_models(a, {"demo"}, timeout_s=30)
    await wait_for_models(b, {"demo"}, timeout_s=30)
    path = str(make_adapter_dir(tmp_path / "adapters", "fresh"))
    proxy.delay(LINK_DELAY_S)

    loaded = await a.http.post(
        "/v1/load_lora_adapter", json={"lora_name": "fresh", "lora_path": path}, timeout=60
    )
    assert loaded.status_code == 200, loaded.text

    assert await _chat(b.url, "fresh") == "fresh"


async def test_a_load_answered_by_a_worker_is_served_at_once_by_a_lagging_frontend(
    lora_workers, two_frontends, tmp_path: Path
) -> None:
    _a, b, proxy = two_frontends
    (worker,) = await asyncio.to_thread(lora_workers, 1)
    await wait_for_models(b, {"demo"}, timeout_s=30)
    uri = f"file://{make_adapter_dir(tmp_path / 'adapters', 'direct')}"
    proxy.delay(LINK_DELAY_S)

    async with httpx.AsyncClient(timeout=60) as http:
        body = {"lora_name": "direct", "source": {"uri": uri}}
        loaded = await http.post(f"{worker.url}/engine/update/load_lora", json=body)
    assert loaded.status_code == 200, loaded.text

    assert await _chat(b.url, "direct") == "direct"


async def test_an_unknown_name_is_still_a_404_once_caught_up(two_frontends) -> None:
    _a, b, proxy = two_frontends
    proxy.delay(LINK_DELAY_S)
    with pytest.raises(openai.NotFoundError, match="nowhere"):
        await _chat(b.url, "nowhere")
