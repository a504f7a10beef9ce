"""Tenants, API keys and quotas end to end: real etcd, NATS, one mocker worker, frontends on
real ports, the real ``openai`` client.

The mocker worker serves the base model ``demo``; tenants are told apart by the models
they may use and by their limits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import openai
import pytest
import structlog.testing

from lorafleet.discovery import watch_cache
from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import api_key_key, tenant_key
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend import access_log, tenants
from lorafleet.frontend.config import FrontendConfig
from lorafleet.launch.cli import main as lorafleet
from lorafleet.proto.errors import UnauthorizedError
from lorafleet.proto.tenants import key_hash
from tests.frontend.conftest import FAST_DISPATCH, RunningFrontend, run_frontend, wait_for_models
from tests.processes import ServiceProcess
from tests.worker.adapters import make_adapter_dir

pytestmark = pytest.mark.slow

ADMIN = {"Authorization": "Bearer adm1n"}
METRICS = {"Authorization": "Bearer m3trics"}
BODY = {"model": "demo", "prompt": "hello", "max_tokens": 2}


@dataclasses.dataclass
class Fleet:
    frontends: list[RunningFrontend]

    @property
    def admin(self) -> httpx.AsyncClient:
        return self.frontends[0].http

    async def tenant(self, name: str, **fields: object) -> str:
        """Create tenant ``name`` with ``fields`` and one key of it through the first frontend;
        the key, once every frontend knows it (the others hear of it by their watches)."""
        tenant = {"name": name, **fields}
        response = await self.admin.post("/v1/tenants", json=tenant, headers=ADMIN)
        assert response.status_code == 200, response.text
        response = await self.admin.post("/v1/keys", json={"tenant": name}, headers=ADMIN)
        assert response.status_code == 201, response.text
        key = str(response.json()["key"])
        for frontend in self.frontends:
            async with asyncio.timeout(10):
                while _tenant_of(frontend, key) != name:
                    await asyncio.sleep(0.01)
        return key


def _tenant_of(frontend: RunningFrontend, key: str) -> str | None:
    """The tenant ``frontend`` serves ``key`` as; None while it has not seen the key or its
    tenant (two watches, so either may come first)."""
    try:
        tenant = frontend.app.state.services.tenants.identify(f"Bearer {key}")
    except UnauthorizedError:
        return None
    return None if tenant is None else tenant.name


@pytest.fixture
async def fleet(
    etcd_url: str, nats_url: str, namespace: str, lora_workers: Callable[..., list[ServiceProcess]]
) -> AsyncIterator[Fleet]:
    """Two frontends (admin token ``adm1n``, metrics token ``m3trics``) and one mocker worker
    of ``demo`` at 10 ms a token, so that requests overlap where a test needs them to."""
    await asyncio.to_thread(lora_workers, 1, "--engine-option", "time_per_token_s=0.01")
    config = FrontendConfig(namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url, dispatch=FAST_DISPATCH,
                            admin_token="adm1n", metrics_token="m3trics")  # fmt: skip
    async with run_frontend(config) as first, run_frontend(config) as second:
        await wait_for_models(first, {"demo"}, timeout_s=90)
        await wait_for_models(second, {"demo"}, timeout_s=90)
        yield Fleet([first, second])


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_without_tenants_the_routes_stay_open(fleet: Fleet) -> None:
    bad = await fleet.admin.post("/v1/tenants", json={"name": "x", "models": []}, headers=ADMIN)
    assert bad.status_code == 400 and "models" in bad.text  # and nothing stored:
    response = await fleet.frontends[0].http.post("/v1/completions", json=BODY)
    assert response.status_code == 200, response.text
    models = await fleet.frontends[1].http.get("/v1/models")
    assert [m["id"] for m in models.json()["data"]] == ["demo"]


async def test_a_key_is_needed_once_tenants_exist_and_a_foreign_model_does_not_exist(
    fleet: Fleet,
) -> None:
    key = await fleet.tenant("team-b", models=["b-*"])
    http = fleet.frontends[1].http
    missing = await http.post("/v1/completions", json=BODY)
    assert missing.status_code == 401, missing.text
    wrong = await http.post("/v1/completions", json=BODY, headers=_bearer("lf-not-a-key"))
    assert wrong.status_code == 401
    denied = await http.post("/v1/completions", json=BODY, headers=_bearer(key))
    assert denied.status_code == 404, denied.text
    assert "does not exist" in denied.json()["error"]["message"]
    assert denied.json()["error"]["message"].endswith("available models: none")  # no leak
    listed = await http.get("/v1/models", headers=_bearer(key))
    assert listed.json()["data"] == []
    assert (await http.get("/v1/models/demo", headers=_bearer(key))).status_code == 404


async def test_a_flooding_tenant_gets_429s_while_another_is_served(fleet: Fleet) -> None:
    flooder = await fleet.tenant("flood", requests_per_s=2)
    calm = await fleet.tenant("calm", models=["demo"])
    http = fleet.frontends[0].http
    flood = [http.post("/v1/completions", json=BODY, headers=_bearer(flooder)) for _ in range(40)]
    steady = [http.post("/v1/completions", json=BODY, headers=_bearer(calm)) for _ in range(10)]
    answers = await asyncio.gather(*flood, *steady)
    refused = [r for r in answers[:40] if r.status_code == 429]
    assert refused, [r.status_code for r in answers[:40]]
    assert int(refused[0].headers["retry-after"]) >= 1
    assert "requests_per_s=2" in refused[0].json()["error"]["message"]
    assert [r.status_code for r in answers[40:]] == [200] * 10
    client = openai.AsyncOpenAI(base_url=f"{fleet.frontends[1].url}/v1", api_key=calm)
    completion = await client.completions.create(model="demo", prompt="hi", max_tokens=2)
    assert completion.choices


async def test_a_concurrency_cap_names_its_limit(fleet: Fleet) -> None:
    key = await fleet.tenant("narrow", max_concurrent=1)
    body = {**BODY, "max_tokens": 64}
    http = fleet.frontends[0].http
    answers = await asyncio.gather(
        *(http.post("/v1/completions", json=body, headers=_bearer(key)) for _ in range(8))
    )
    statuses = [r.status_code for r in answers]
    assert 200 in statuses and 429 in statuses, statuses
    refused = next(r for r in answers if r.status_code == 429)
    assert "max_concurrent=1" in refused.json()["error"]["message"]


async def test_a_revoked_key_is_refused_on_every_frontend(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Made, listed and revoked with the CLI on the first frontend; refused on both."""
    monkeypatch.setenv("DYN_ADMIN_TOKEN", "adm1n")
    where = ["--frontend", fleet.frontends[0].url]
    assert await _cli("tenants", "set", "gone", "--model", "demo", *where) == 0
    assert await _cli("keys", "create", "gone", "--note", "ci", *where) == 0
    key = capsys.readouterr().out.strip().splitlines()[-1]
    assert key.startswith("lf-")
    for frontend in fleet.frontends:
        async with asyncio.timeout(10):  # the second frontend hears of the key by its watch
            while (await frontend.http.get("/v1/models", headers=_bearer(key))).status_code != 200:
                await asyncio.sleep(0.05)
    assert await _cli("keys", "list", "--json", *where) == 0
    listed = json.loads(capsys.readouterr().out)["data"]
    assert [(k["tenant"], k["note"]) for k in listed] == [("gone", "ci")]
    assert key not in json.dumps(listed)  # only the hash's prefix is known
    assert await _cli("keys", "revoke", listed[0]["id"], *where) == 0
    for frontend in fleet.frontends:
        gate = frontend.app.state.services.tenants
        async with asyncio.timeout(10):
            while any(view.id == listed[0]["id"] for view in gate.key_views()):
                await asyncio.sleep(0.01)
        response = await frontend.http.post("/v1/completions", json=BODY, headers=_bearer(key))
        assert response.status_code == 401, response.text


async def _cli(*argv: str) -> int:
    return await asyncio.to_thread(lorafleet, list(argv))


async def test_a_token_rate_counts_prompt_and_completion(fleet: Fleet) -> None:
    key = await fleet.tenant("wordy", tokens_per_min=20)  # 10 a minute on each of 2 frontends
    http = fleet.frontends[0].http
    first = await http.post("/v1/completions", json={**BODY, "max_tokens": 16},
                            headers=_bearer(key))  # fmt: skip
    assert first.status_code == 200, first.text
    assert first.json()["usage"]["total_tokens"] > 10
    second = await http.post("/v1/completions", json=BODY, headers=_bearer(key))
    assert second.status_code == 429, second.text
    assert "tokens_per_min=20" in second.json()["error"]["message"]
    assert int(second.headers["retry-after"]) >= 1
    metrics = (await http.get("/metrics", headers=METRICS)).text
    refusals = 'lorafleet_frontend_tenant_refusals_total{limit="tokens_per_min",tenant="wordy"} 1.0'
    assert refusals in metrics
    assert 'lorafleet_frontend_tenant_tokens_total{tenant="wordy"}' in metrics


async def test_the_access_line_names_the_tenant_never_the_key(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = structlog.testing.LogCapture()  # the tests' log level hides access lines
    logger = structlog.wrap_logger(
        None, processors=[capture], wrapper_class=structlog.make_filtering_bound_logger(0)
    )
    monkeypatch.setattr(access_log, "log", logger)
    key = await fleet.tenant("logged")
    response = await fleet.frontends[0].http.post(
        "/v1/completions", json=BODY, headers=_bearer(key)
    )
    assert response.status_code == 200, response.text
    async with asyncio.timeout(10):  # the line is written just after the answer left
        while not any(line["route"] == "/v1/completions" for line in capture.entries):
            await asyncio.sleep(0.01)
    access = [line for line in capture.entries if line["route"] == "/v1/completions"]
    assert [line["tenant"] for line in access] == ["logged"]
    assert key not in repr(capture.entries)


async def _declare(http: httpx.AsyncClient, root: Path, name: str) -> None:
    """Declare adapter ``name`` of ``demo`` with no copy (nothing loads it) and alias
    ``{name}-alias`` over it."""
    uri = f"file://{make_adapter_dir(root, name)}"
    body = {"name": name, "base_model": "demo", "source": {"uri": uri}, "replicas": 0}
    response = await http.post("/v1/adapters", json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    alias = {"name": f"{name}-alias", "targets": [{"model": name, "weight": 100}]}
    response = await http.post("/v1/aliases", json=alias, headers=ADMIN)
    assert response.status_code == 201, response.text


async def test_the_fleets_state_shows_a_key_only_its_tenants_names(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Issue 39, item 3: listings and ``/metrics`` must not undo the generate routes' 404."""
    await _declare(fleet.admin, tmp_path, "b-bot")
    await _declare(fleet.admin, tmp_path, "a-secret")
    key = await fleet.tenant("team-b", models=["b-*"])
    http = fleet.frontends[1].http
    for path in (
        "/v1/adapters",
        "/v1/adapters/a-secret",
        "/v1/aliases",
        "/v1/aliases/a-secret-alias",
    ):
        assert (await http.get(path)).status_code == 401, path
        assert (await http.get(path, headers=_bearer("lf-not-a-key"))).status_code == 401, path
    mine = _bearer(key)
    adapters = await http.get("/v1/adapters", headers=mine)
    assert [a["name"] for a in adapters.json()["data"]] == ["b-bot"]
    aliases = await http.get("/v1/aliases", headers=mine)
    assert [a["name"] for a in aliases.json()["data"]] == ["b-bot-alias"]
    assert (await http.get("/v1/adapters/b-bot", headers=mine)).status_code == 200
    for kind, hidden, absent in (("adapters", "a-secret", "a-none"),
                                 ("aliases", "a-secret-alias", "a-none-alias")):  # fmt: skip
        foreign = await http.get(f"/v1/{kind}/{hidden}", headers=mine)
        nobody = await http.get(f"/v1/{kind}/{absent}", headers=mine)
        assert foreign.status_code == nobody.status_code == 404, foreign.text
        assert foreign.text.replace(hidden, absent) == nobody.text  # the same "does not exist"
    everything = await http.get("/v1/adapters", headers=ADMIN)
    assert [a["name"] for a in everything.json()["data"]] == ["a-secret", "b-bot"]
    monkeypatch.setenv("DYN_ADMIN_TOKEN", "adm1n")  # the CLI's reads send it
    assert await _cli("lora", "status", "--frontend", fleet.frontends[1].url) == 0
    shown = capsys.readouterr().out
    assert "a-secret-alias" in shown and "b-bot-alias" in shown
    for headers in ({}, mine, ADMIN):  # /metrics is behind its own token
        assert (await http.get("/metrics", headers=headers)).status_code == 401
    assert (await http.get("/metrics", headers=METRICS)).status_code == 200


BAD_NUMBERS = [
    ("/v1/tenants", {"name": "t", "requests_per_s": 1e-310}, "requests_per_s"),
    ("/v1/tenants", {"name": "t", "requests_per_s": 1e300}, "requests_per_s"),
    ("/v1/tenants", {"name": "t", "tokens_per_min": 2**64}, "tokens_per_min"),
    ("/v1/tenants", {"name": "t", "max_concurrent": "100"}, "max_concurrent"),
    ("/v1/aliases", {"name": "al", "targets": [{"model": "b-bot", "weight": "100"}]}, "weight"),
    ("/v1/rollouts", {"alias": "al", "canary": "b-bot", "policy": {"window_s": 5e-324}},
     "policy.window_s"),
    ("/v1/rollouts", {"alias": "al", "canary": "b-bot", "policy": {"window_s": 1e300}},
     "policy.window_s"),
    ("/v1/rollouts", {"alias": "al", "canary": "b-bot", "policy": {"min_requests": 2**64}},
     "policy.min_requests"),
    ("/v1/rollouts", {"alias": "al", "canary": "b-bot", "weight": "10"}, "weight"),
    ("/v1/adapters", {"name": "s", "base_model": "demo", "source": {"uri": "file:///x"},
                      "slo": {"ttft_p95_ms": "300"}}, "slo.ttft_p95_ms"),
]  # fmt: skip


async def test_numbers_out_of_range_or_sent_as_strings_are_refused_naming_the_field(
    fleet: Fleet,
) -> None:
    """Issue 39, item 4: each was stored (and some then made every request a 500)."""
    for path, body, field in BAD_NUMBERS:
        refused = await fleet.admin.post(path, json=body, headers=ADMIN)
        assert refused.status_code == 400, (path, body, refused.text)
        assert field in refused.json()["error"]["message"], (path, body, refused.text)
    for path in ("/v1/tenants", "/v1/aliases", "/v1/adapters"):
        assert (await fleet.admin.get(path, headers=ADMIN)).json()["data"] == [], path
    key = await fleet.tenant("slow", requests_per_s=0.001)  # one in 2,000 s on each frontend
    http = fleet.frontends[0].http
    assert (await http.post("/v1/completions", json=BODY, headers=_bearer(key))).status_code == 200
    refused = await http.post("/v1/completions", json=BODY, headers=_bearer(key))
    assert refused.status_code == 429, refused.text
    assert 1 <= int(refused.headers["retry-after"]) <= 60


async def test_a_key_needs_bearer_and_does_not_outlive_its_tenant(
    fleet: Fleet, etcd: EtcdClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39, item 5: the scheme is checked, a tenant deleted behind the frontends' backs
    (etcdctl, or a key made on one frontend while another deleted its tenant) does not come
    back with its old keys, and no log line holds a key's id or hash."""
    capture = structlog.testing.LogCapture()
    logger = structlog.wrap_logger(
        None, processors=[capture], wrapper_class=structlog.make_filtering_bound_logger(0)
    )
    monkeypatch.setattr(tenants, "log", logger)
    monkeypatch.setattr(watch_cache, "log", logger)
    key = await fleet.tenant("keyed", models=["demo"])
    http = fleet.frontends[1].http
    assert (await http.post("/v1/completions", json=BODY, headers={"Authorization": key})
            ).status_code == 401  # fmt: skip
    await etcd.delete(tenant_key(namespace, "keyed").encode())
    for frontend in fleet.frontends:
        async with asyncio.timeout(10):
            while frontend.app.state.services.tenants.tenant("keyed") is not None:
                await asyncio.sleep(0.01)
    assert (await http.post("/v1/completions", json=BODY, headers=_bearer(key))).status_code == 401
    again = await fleet.admin.post("/v1/tenants", json={"name": "keyed"}, headers=ADMIN)
    assert again.status_code == 409 and "revoke" in again.json()["error"]["message"], again.text
    (orphan,) = (await fleet.admin.get("/v1/keys", headers=ADMIN)).json()["data"]
    assert (await fleet.admin.delete(f"/v1/keys/{orphan['id']}", headers=ADMIN)).status_code == 204
    again = await fleet.admin.post("/v1/tenants", json={"name": "keyed"}, headers=ADMIN)
    assert again.status_code == 200, again.text  # this frontend has seen both writes:
    answer = await fleet.admin.post("/v1/completions", json=BODY, headers=_bearer(key))
    assert answer.status_code == 401, answer.text
    hashed = key_hash("lf-broken")
    await etcd.put(api_key_key(namespace, hashed).encode(), b"not json")
    async with asyncio.timeout(10):
        while not any("does not decode" in line["event"] for line in capture.entries):
            await asyncio.sleep(0.01)
    logged = repr(capture.entries)
    assert "API key created" in logged and "API key revoked" in logged
    for secret in (key, key_hash(key)[:12], orphan["id"], hashed[:12]):
        assert secret not in logged
