"""Aliases and canary rollouts end to end: real etcd, NATS, mocker workers, frontends on real ports.

One mocker worker serves ``demo`` with three declared versions of ``bot``; ``bot-v3`` fails
30% of its requests (the mocker's ``fail_generate`` fault injection). Requests go through
real HTTP; every answer's ``model`` says which version answered.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import ALIASES_ROOT
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from lorafleet.launch.cli import main as lorafleet
from tests.frontend.conftest import FAST_DISPATCH, RunningFrontend, run_frontend, wait_for_models
from tests.processes import ServiceProcess
from tests.worker.adapters import make_adapter_dir

pytestmark = pytest.mark.slow

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
VERSIONS = ("bot-v1", "bot-v2", "bot-v3")
FAILING = "bot-v3"


@dataclasses.dataclass
class Fleet:
    frontends: list[RunningFrontend]

    @property
    def http(self) -> httpx.AsyncClient:
        return self.frontends[0].http


def _config(etcd_url: str, nats_url: str, namespace: str) -> FrontendConfig:
    return FrontendConfig(namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url),
                          nats_server=nats_url, dispatch=FAST_DISPATCH,
                          admin_token=TOKEN)  # fmt: skip


@pytest.fixture
async def fleet(
    tmp_path: Path,
    etcd_url: str,
    nats_url: str,
    namespace: str,
    lora_workers: Callable[..., list[ServiceProcess]],
) -> AsyncIterator[Fleet]:
    """Two frontends, one mocker worker, ``bot-v1..3`` declared and placed, ``other-v1`` declared
    for another base model."""
    faults = ("--engine-option", f"fail_generate={FAILING}",
              "--engine-option", "fail_generate_share=0.3")  # fmt: skip
    await asyncio.to_thread(lora_workers, 1, *faults)
    config = _config(etcd_url, nats_url, namespace)
    async with run_frontend(config) as first, run_frontend(config) as second:
        for name in VERSIONS:
            await _declare(first.http, tmp_path, name, "demo", replicas=1)
        await _declare(first.http, tmp_path, "other-v1", "other", replicas=0)
        await wait_for_models(first, {"demo", *VERSIONS}, timeout_s=90)
        await wait_for_models(second, {"demo", *VERSIONS}, timeout_s=90)
        yield Fleet([first, second])


async def _declare(
    http: httpx.AsyncClient, tmp_path: Path, name: str, base: str, replicas: int
) -> None:
    uri = f"file://{make_adapter_dir(tmp_path / 'adapters', name, base_model=base)}"
    body = {"name": name, "base_model": base, "source": {"uri": uri}, "replicas": replicas}
    response = await http.post("/v1/adapters", json=body, headers=AUTH)
    assert response.status_code == 201, response.text


async def _alias(http: httpx.AsyncClient, name: str, **weights: int) -> httpx.Response:
    targets = [{"model": model.replace("_", "-"), "weight": w} for model, w in weights.items()]
    return await http.post("/v1/aliases", json={"name": name, "targets": targets}, headers=AUTH)


async def _ask(
    http: httpx.AsyncClient, model: str, *, user: str | None = None, session: str | None = None
) -> httpx.Response:
    body: dict[str, Any] = {"model": model, "prompt": "hi", "max_tokens": 1}
    if user is not None:
        body["user"] = user
    headers = {"x-session-id": session} if session is not None else {}
    return await http.post("/v1/completions", json=body, headers=headers, timeout=30)


async def _answers(http: httpx.AsyncClient, model: str, count: int, **who: str) -> list[str]:
    """The ``model`` of ``count`` answers, 16 requests at a time; all must be 200."""
    gate = asyncio.Semaphore(16)

    async def one() -> str:
        async with gate:
            answer = await _ask(http, model, **who)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["model"])

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def test_an_alias_splits_90_10_and_the_answer_names_the_version(fleet: Fleet) -> None:
    assert (await _alias(fleet.http, "bot", bot_v1=90, bot_v2=10)).status_code == 201
    counts = collections.Counter(await _answers(fleet.http, "bot", 2000))
    assert set(counts) == {"bot-v1", "bot-v2"}
    assert 100 <= counts["bot-v2"] <= 300, counts  # 10% of 2,000 within ±5 points
    models = (await fleet.http.get("/v1/models")).json()["data"]
    (entry,) = [model for model in models if model["id"] == "bot"]
    assert entry["targets"] == [
        {"model": "bot-v1", "weight": 90},
        {"model": "bot-v2", "weight": 10},
    ]
    assert entry["parent"] == "demo"
    one = (await fleet.http.get("/v1/models/bot")).json()
    assert (one["id"], one["targets"]) == ("bot", entry["targets"])


async def test_a_session_stays_on_one_version_by_user_or_header(fleet: Fleet) -> None:
    assert (await _alias(fleet.http, "bot", bot_v1=50, bot_v2=50)).status_code == 201
    seen: dict[str, set[str]] = {}
    for index in range(40):
        for who in ({"user": f"user-{index}"}, {"session": f"conversation-{index}"}):
            key = f"{next(iter(who))}-{index}"
            seen[key] = set(await _answers(fleet.http, "bot", 4, **who))
    assert all(len(versions) == 1 for versions in seen.values()), seen
    assert set().union(*seen.values()) == {"bot-v1", "bot-v2"}


async def test_streamed_chunks_name_the_version(fleet: Fleet) -> None:
    assert (await _alias(fleet.http, "bot", bot_v2=100)).status_code == 201
    body = {"model": "bot", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "stream": True}  # fmt: skip
    answer = await fleet.http.post("/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200
    assert '"model":"bot-v2"' in answer.text and '"model":"bot"' not in answer.text


def _rollout_ended(record: dict) -> bool:
    """The alias's rollout is over; a frontend whose watch has not seen it start yet (the
    second frontend, just after the first took the rollout) shows none at all."""
    return record["rollout"] is not None and record["rollout"]["phase"] != "running"


async def _until(http: httpx.AsyncClient, alias: str, done: Callable[[dict], bool]) -> dict:
    """Send requests to ``alias`` through every frontend until its record satisfies ``done``."""
    async with asyncio.timeout(120):
        while True:
            record = (await http.get(f"/v1/aliases/{alias}")).json()
            if done(record):
                return record
            await asyncio.gather(*(_ask(http, alias) for _ in range(24)))  # split at random


async def test_a_canary_failing_30_percent_is_rolled_back_by_the_frontends(fleet: Fleet) -> None:
    assert (await _alias(fleet.http, "bot", bot_v1=100)).status_code == 201
    # TTFT on a busy test machine is noise: only the error rate may decide here.
    policy = {
        "max_error_rate": 0.1,
        "max_ttft_p95_ratio": 1000,
        "min_requests": 10,
        "window_s": 1.0,
    }
    body = {"alias": "bot", "canary": FAILING, "weight": 50, "policy": policy}
    started = await fleet.http.post("/v1/rollouts", json=body, headers=AUTH)
    assert started.status_code == 201, started.text
    assert started.json()["rollout"]["phase"] == "running"

    second = fleet.frontends[1].http
    traffic = asyncio.create_task(_until(second, "bot", _rollout_ended))
    record = await _until(fleet.http, "bot", _rollout_ended)
    await traffic
    rollout = record["rollout"]
    assert rollout["phase"] == "rolled_back", rollout
    assert record["targets"] == [{"model": "bot-v1", "weight": 100}]
    assert "error rate" in rollout["reason"] and FAILING in rollout["reason"]
    canary = rollout["figures"]["canary"]
    assert canary["errors"] > 0 and canary["error_rate"] > 0.1
    assert set(await _answers(fleet.http, "bot", 20)) == {"bot-v1"}
    metrics = (await fleet.http.get("/metrics")).text
    assert (
        'lorafleet_frontend_alias_requests_total{alias="bot",outcome="error",version="bot-v3"}'
        in metrics
    )


async def test_a_canary_whose_adapter_is_deleted_is_rolled_back(fleet: Fleet) -> None:
    assert (await _alias(fleet.http, "bot", bot_v1=100)).status_code == 201
    policy = {"min_requests": 5, "max_ttft_p95_ratio": 1000, "window_s": 1.0}
    body = {"alias": "bot", "canary": "bot-v2", "weight": 50, "policy": policy}
    assert (await fleet.http.post("/v1/rollouts", json=body, headers=AUTH)).status_code == 201
    assert (await fleet.http.delete("/v1/adapters/bot-v2", headers=AUTH)).status_code == 200
    record = await _until(fleet.http, "bot", _rollout_ended)
    assert record["rollout"]["phase"] == "rolled_back", record
    assert record["targets"] == [{"model": "bot-v1", "weight": 100}]


async def test_a_healthy_canary_is_promoted_through_its_steps(fleet: Fleet) -> None:
    assert (await _alias(fleet.http, "bot", bot_v1=100)).status_code == 201
    policy = {
        "min_requests": 3,
        "max_ttft_p95_ratio": 1000,
        "window_s": 1.0,
        "steps": [10, 50, 100],
    }
    body = {"alias": "bot", "canary": "bot-v2", "policy": policy}
    started = await fleet.http.post("/v1/rollouts", json=body, headers=AUTH)
    assert started.status_code == 201, started.text
    assert started.json()["targets"] == [{"model": "bot-v1", "weight": 90},
                                         {"model": "bot-v2", "weight": 10}]  # fmt: skip
    weights: set[int] = set()

    def promoted(record: dict) -> bool:
        weights.add(record["rollout"]["weight"])
        return record["rollout"]["phase"] != "running"

    record = await _until(fleet.http, "bot", promoted)
    assert record["rollout"]["phase"] == "promoted", record
    assert record["targets"] == [{"model": "bot-v2", "weight": 100}]
    assert record["rollout"]["reason"].startswith("healthy")
    assert set(await _answers(fleet.http, "bot", 10)) == {"bot-v2"}


async def _snapshot(etcd: EtcdClient) -> list[tuple[bytes, bytes, int]]:
    listing = await etcd.get_prefix(ALIASES_ROOT.encode())
    return sorted((kv.key, kv.value, kv.mod_revision) for kv in listing)


BAD_ALIASES = [
    ("bot", {"bot": 100}, 400, "points at itself"),
    ("bot2", {"bot": 100}, 400, "points at alias 'bot'"),
    ("bot2", {"ghost": 100}, 400, "'ghost' of alias 'bot2' does not exist"),
    ("bot2", {"bot-v1": 50, "other-v1": 50}, 400, "different base models"),
    ("bot2", {"bot-v1": 50, "bot-v2": 40}, 400, "sum to 90"),
    ("bot2", {"bot-v1": -10, "bot-v2": 110}, 400, "targets[0].weight: Expected `int` >= 0"),
    ("bot-v2", {"bot-v1": 100}, 409, "'bot-v2' is an adapter the fleet serves"),
    ("demo", {"bot-v1": 100}, 409, "'demo' is a base model"),
    ("other-v1", {"bot-v1": 100}, 409, "'other-v1' is a declared adapter"),
    ("bot2", {"demo": 100}, 400, "'demo' of alias 'bot2' is a base model"),
]


async def test_each_bad_alias_is_refused_naming_the_problem_and_changes_nothing(
    fleet: Fleet, etcd: EtcdClient
) -> None:
    assert (await _alias(fleet.http, "bot", bot_v1=100)).status_code == 201
    before = await _snapshot(etcd)
    for name, targets, status, words in BAD_ALIASES:
        body = {"name": name, "targets": [{"model": m, "weight": w} for m, w in targets.items()]}
        refused = await fleet.http.post("/v1/aliases", json=body, headers=AUTH)
        assert refused.status_code == status, (name, targets, refused.text)
        assert words in refused.json()["error"]["message"], (name, targets)
        assert await _snapshot(etcd) == before, (name, targets)


BAD_ROLLOUTS = [
    ({"canary": "ghost"}, 400, "canary 'ghost' of alias 'bot' is not declared"),
    ({"canary": "other-v1"}, 400, "different base models"),
    ({"canary": "bot-v2", "weight": 100}, 400, "weight: Expected `int` <= 99"),
    ({"canary": "bot-v2", "policy": {"steps": [50, 10]}}, 400, "rise strictly"),
    ({"canary": "bot-v2", "policy": {"max_error_rate": 2}}, 400, "max_error_rate"),
    ({"alias": "new", "canary": "bot-v2"}, 409, "name its current version as baseline"),
]


async def test_each_bad_rollout_is_refused_naming_the_problem_and_changes_nothing(
    fleet: Fleet, etcd: EtcdClient
) -> None:
    assert (await _alias(fleet.http, "bot", bot_v1=100)).status_code == 201
    before = await _snapshot(etcd)
    for fields, status, words in BAD_ROLLOUTS:
        body = {"alias": "bot", **fields}
        refused = await fleet.http.post("/v1/rollouts", json=body, headers=AUTH)
        assert refused.status_code == status, (fields, refused.text)
        assert words in refused.json()["error"]["message"], fields
        assert await _snapshot(etcd) == before, fields


async def test_an_adapter_named_like_an_alias_is_refused(fleet: Fleet, tmp_path: Path) -> None:
    assert (await _alias(fleet.http, "bot", bot_v1=100)).status_code == 201
    uri = f"file://{make_adapter_dir(tmp_path / 'adapters', 'bot')}"
    body = {"name": "bot", "base_model": "demo", "source": {"uri": uri}}
    refused = await fleet.http.post("/v1/adapters", json=body, headers=AUTH)
    assert refused.status_code == 409, refused.text
    assert "'bot' is an alias" in refused.json()["error"]["message"]
    assert (await fleet.http.get("/v1/adapters/bot")).status_code == 404


async def test_writes_need_the_admin_token(fleet: Fleet, etcd: EtcdClient) -> None:
    before = await _snapshot(etcd)
    body = {"name": "bot", "targets": [{"model": "bot-v1", "weight": 100}]}
    assert (await fleet.http.post("/v1/aliases", json=body)).status_code == 401
    rollout = {"alias": "bot", "canary": "bot-v2", "baseline": "bot-v1"}
    assert (await fleet.http.post("/v1/rollouts", json=rollout)).status_code == 401
    assert await _snapshot(etcd) == before


async def test_the_cli_sets_rolls_out_promotes_rolls_back_and_shows_status(
    fleet: Fleet, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYN_ADMIN_TOKEN", TOKEN)
    url = ("--frontend", fleet.frontends[0].url)

    async def cli(*argv: str) -> int:
        return await asyncio.to_thread(lorafleet, ["lora", *argv, *url])

    assert await cli("alias", "bot", "bot-v1=100") == 0
    assert await cli("rollout", "bot", "bot-v2", "--steps", "20,100", "--window-s", "60") == 0
    assert await cli("promote", "bot") == 0
    assert "promoted" in capsys.readouterr().out
    assert await cli("alias", "bot", "bot-v1=100") == 0
    assert await cli("rollout", "bot", "bot-v2", "--weight", "30") == 0
    assert await cli("rollback", "bot", "--reason", "answers too long") == 0
    capsys.readouterr()
    assert await cli("status", "bot") == 0
    shown = capsys.readouterr().out
    assert "bot-v1:100" in shown and "rolled_back" in shown and "answers too long" in shown
    assert await cli("alias", "bot", "bot-v1=90") == 1  # refused: the weights sum to 90
    assert "sum to 90" in capsys.readouterr().out


async def test_a_deleted_alias_is_gone_from_models_and_answers_404(fleet: Fleet) -> None:
    assert (await _alias(fleet.http, "bot", bot_v1=100)).status_code == 201
    assert (await fleet.http.delete("/v1/aliases/bot")).status_code == 401
    deleted = await fleet.http.delete("/v1/aliases/bot", headers=AUTH)
    assert deleted.status_code == 200 and deleted.json()["name"] == "bot"
    assert (await fleet.http.get("/v1/aliases")).json()["data"] == []
    models = {model["id"] for model in (await fleet.http.get("/v1/models")).json()["data"]}
    assert "bot" not in models
    assert (await _ask(fleet.http, "bot")).status_code == 404
