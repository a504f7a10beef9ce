"""Shedding by priority end to end: real etcd, NATS, a mocker worker slow per token so the
fleet saturates, a frontend on a real port with ``--fleet-max-inflight 2``, real HTTP.

Two tenants may use ``demo``: ``batch`` (priority 0) floods, ``live`` (priority 9) sends a
few requests while the flood holds every slot and every queue place.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import openai
import pytest

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.admission import AdmissionSettings, FleetAdmission
from lorafleet.frontend.config import FrontendConfig
from tests.frontend.conftest import FAST_DISPATCH, RunningFrontend, run_frontend, wait_for_models
from tests.processes import ServiceProcess

pytestmark = pytest.mark.slow

ADMIN = {"Authorization": "Bearer adm1n"}
SLOTS = 2
LONG_BODY = {"model": "demo", "prompt": "hello", "max_tokens": 64}  # about 5 s at 80 ms a token
SHORT_BODY = {"model": "demo", "prompt": "hello", "max_tokens": 2}
FLOOD = 8
WAIT_S = 120.0  # generous: a busy machine must not turn a wait into a refusal


@pytest.fixture
async def frontend(
    etcd_url: str, nats_url: str, namespace: str, lora_workers: Callable[..., list[ServiceProcess]]
) -> AsyncIterator[RunningFrontend]:
    await asyncio.to_thread(lora_workers, 1, "--engine-option", "time_per_token_s=0.08")
    config = FrontendConfig(
        namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url), nats_server=nats_url,
        dispatch=FAST_DISPATCH, admin_token="adm1n", metrics_token="m3trics",
        admission=AdmissionSettings(fleet_max_inflight=SLOTS, wait_s=WAIT_S),
    )  # fmt: skip
    async with run_frontend(config) as running:
        await wait_for_models(running, {"demo"}, timeout_s=90)
        yield running


async def _key(http: httpx.AsyncClient, name: str, priority: int) -> dict[str, str]:
    """Create tenant ``name`` of ``priority`` and a key of it; its ``Authorization`` header."""
    tenant = {"name": name, "models": ["demo"], "priority": priority}
    assert (await http.post("/v1/tenants", json=tenant, headers=ADMIN)).status_code == 200
    made = await http.post("/v1/keys", json={"tenant": name}, headers=ADMIN)
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['key']}"}


async def _saturated(admission: FleetAdmission) -> None:
    """Wait until every slot runs and every queue place holds a request."""
    async with asyncio.timeout(60):
        while admission.inflight < SLOTS or admission.waiting < SLOTS:
            await asyncio.sleep(0.01)


async def test_under_saturation_the_high_priority_tenant_is_served_and_the_low_one_shed(
    frontend: RunningFrontend,
) -> None:
    http = frontend.http
    batch, live = await _key(http, "batch", 0), await _key(http, "live", 9)
    admission: FleetAdmission = frontend.app.state.services.admission
    async with httpx.AsyncClient(base_url=frontend.url, timeout=WAIT_S + 60) as client:
        flood = [
            asyncio.create_task(client.post("/v1/completions", json=LONG_BODY, headers=batch))
            for _ in range(FLOOD)
        ]
        await _saturated(admission)
        served = await asyncio.gather(
            *(client.post("/v1/completions", json=SHORT_BODY, headers=live) for _ in range(SLOTS))
        )
        flooded = await asyncio.gather(*flood)

    assert [r.status_code for r in served] == [200] * SLOTS, [r.text for r in served]
    shed = [r for r in flooded if r.status_code == 429]
    assert len(shed) >= FLOOD - 2 * SLOTS, [r.status_code for r in flooded]
    assert {r.status_code for r in flooded} == {200, 429}
    for refusal in shed:
        assert int(refusal.headers["retry-after"]) >= 1
        message = refusal.json()["error"]["message"]
        assert "fleet is saturated" in message and "tenant 'batch', priority 0" in message
    # the queued batch requests made way for live's
    assert any("took its place" in r.json()["error"]["message"] for r in shed)
    metrics = (await http.get("/metrics", headers={"Authorization": "Bearer m3trics"})).text
    refused = 'lorafleet_frontend_tenant_refusals_total{limit="saturated",tenant="batch"} '
    assert f"{refused}{float(len(shed))}" in metrics
    async with asyncio.timeout(10):  # each slot is given back just after its answer left
        while admission.inflight or admission.waiting:
            await asyncio.sleep(0.01)
    calm = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key=batch["Authorization"][7:])
    completion = await calm.completions.create(model="demo", prompt="hi", max_tokens=2)
    assert completion.choices  # once the flood is over, batch is served again
