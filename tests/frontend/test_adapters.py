"""``/v1/adapters`` over real HTTP and etcd: validation, storage, auth, listing, deletion.

A stand-in worker supplies the live base model ``demo`` (and a loaded ``pirate``);
on-demand loading with real workers is in test_on_demand.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import msgspec
import pytest

from lorafleet.discovery.keys import adapter_key
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from lorafleet.launch.cli import main as lorafleet
from lorafleet.proto.adapters import AdapterSpec, LoraSource
from lorafleet.proto.naming import lora_slug
from lorafleet.proto.slo import SloTargets
from tests.frontend.conftest import FAST_DISPATCH, run_frontend, wait_for_models
from tests.frontend.stand_in import StandInWorker

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET_URI = "s3://bucket/org/robot?X-Amz-Signature=abc123"


def _spec(name: str = "org/robot", **fields: object) -> dict:
    body = {"name": name, "base_model": "demo", "source": {"uri": SECRET_URI}, "replicas": 0}
    return body | fields


@pytest.fixture
async def admin_frontend(etcd_url: str, nats_url: str, namespace: str):
    config = FrontendConfig(namespace=namespace,
                            etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url,
                            dispatch=FAST_DISPATCH, admin_token=TOKEN)  # fmt: skip
    async with run_frontend(config) as running:
        yield running


@pytest.fixture
async def demo(workers, nats_url, etcd, namespace, admin_frontend) -> StandInWorker:
    worker = await StandInWorker(nats_url, etcd, namespace, "demo", adapters=("pirate",)).start()
    workers.append(worker)
    await wait_for_models(admin_frontend, {"demo", "pirate"})
    return worker


async def test_apply_stores_under_the_slug_and_answers_201_then_200(
    admin_frontend, demo, etcd, namespace
) -> None:
    http = admin_frontend.http
    created = await http.post("/v1/adapters", json=_spec(), headers=AUTH)
    assert created.status_code == 201, created.text
    answer = created.json()
    assert answer["source"]["uri"] == "s3://bucket/org/robot?X-Amz-Signature=***"
    assert (answer["replicas"], answer["instances"], answer["warnings"]) == (0, [], [])
    stored = await etcd.get(adapter_key(namespace, lora_slug("org/robot")).encode())
    assert msgspec.json.decode(stored.value, type=AdapterSpec).source.uri == SECRET_URI
    again = await http.post("/v1/adapters", json=_spec(), headers=AUTH)
    assert again.status_code == 200
    changed = await http.post("/v1/adapters", json=_spec(replicas="all"), headers=AUTH)
    assert changed.status_code == 201
    assert changed.json()["replicas"] == "all"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (_spec(name="../x"), "name '../x' is not safe"),
        (_spec(name="demo"), "base model's name"),
        (_spec(replicas=-2), "replicas"),
        (_spec(replicas="some"), "replicas"),
        (_spec(source={"uri": "/no/scheme"}), "source.uri"),
        ({"name": "x", "source": {"uri": "file:///x"}}, "base_model"),
        (_spec(slo={"ttft_p95_ms": -300}), "slo.ttft_p95_ms"),
        (_spec(slo={"ttft_p95_ms": 0}), "slo.ttft_p95_ms"),
        (_spec(slo={"itl_p95_ms": 1e12}), "slo.itl_p95_ms"),
        (_spec(slo={"itl_p95_ms": "fast"}), "slo.itl_p95_ms"),
    ],
)
async def test_invalid_specs_are_400_naming_the_field(admin_frontend, body, words) -> None:
    response = await admin_frontend.http.post("/v1/adapters", json=body, headers=AUTH)
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"]


async def test_a_bad_latency_target_changes_nothing(admin_frontend, demo, etcd, namespace) -> None:
    http = admin_frontend.http
    assert (await http.post("/v1/adapters", json=_spec(), headers=AUTH)).status_code == 201
    key = adapter_key(namespace, lora_slug("org/robot")).encode()
    before = await etcd.get(key)
    refused = await http.post(
        "/v1/adapters", json=_spec(slo={"ttft_p95_ms": -1}, replicas=2), headers=AUTH
    )
    assert refused.status_code == 400
    assert "slo.ttft_p95_ms of adapter 'org/robot' is -1" in refused.json()["error"]["message"]
    assert (await etcd.get(key)).mod_revision == before.mod_revision
    shown = (await http.get("/v1/adapters/org/robot")).json()
    assert (shown["replicas"], shown["slo"], shown["attainment"]) == (0, None, None)


async def test_targets_without_room_for_a_copy_are_stored_with_a_warning(
    admin_frontend, demo
) -> None:
    http = admin_frontend.http
    fixed = await http.post("/v1/adapters", json=_spec(replicas=1, slo={"ttft_p95_ms": 300}),
                            headers=AUTH)  # fmt: skip
    assert fixed.status_code == 201
    assert any("can add no copy: max_replicas is 1" in w for w in fixed.json()["warnings"])
    room = _spec(min_replicas=1, max_replicas=2, slo={"ttft_p95_ms": 300})
    spaced = await http.post("/v1/adapters", json=room, headers=AUTH)
    assert not any("can add no copy" in w for w in spaced.json()["warnings"])


async def test_writes_need_the_admin_token_reads_do_not(admin_frontend, demo) -> None:
    http = admin_frontend.http
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        refused = await http.post("/v1/adapters", json=_spec(), headers=headers)
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
        assert "DYN_ADMIN_TOKEN" in refused.json()["error"]["message"]
    assert (await http.post("/v1/adapters", json=_spec(), headers=AUTH)).status_code == 201
    assert (await http.delete("/v1/adapters/org/robot")).status_code == 401
    assert (await http.get("/v1/adapters")).status_code == 200
    assert (await http.get("/v1/adapters/org/robot")).status_code == 200


async def test_list_shows_desired_replicas_and_the_instances_that_have_it(
    admin_frontend, demo
) -> None:
    http = admin_frontend.http
    for body in (_spec("pirate", replicas=1), _spec("org/robot")):
        assert (await http.post("/v1/adapters", json=body, headers=AUTH)).is_success
    listing = (await http.get("/v1/adapters")).json()
    assert listing["object"] == "list"
    rows = {row["name"]: (row["replicas"], row["instances"]) for row in listing["data"]}
    assert rows == {"org/robot": (0, []), "pirate": (1, [f"{demo.instance_id:x}"])}
    one = (await http.get("/v1/adapters/org/robot")).json()
    assert (one["name"], one["base_model"], one["pinned"]) == ("org/robot", "demo", False)


async def test_unknown_base_model_is_stored_with_a_warning_and_a_base_name_conflicts(
    admin_frontend, demo
) -> None:
    http = admin_frontend.http
    stored = await http.post("/v1/adapters", json=_spec(base_model="llama"), headers=AUTH)
    assert stored.status_code == 201
    assert "no live instance serves base model 'llama'" in stored.json()["warnings"][0]
    clash = await http.post(
        "/v1/adapters", json=_spec(name="demo", base_model="other"), headers=AUTH
    )
    assert clash.status_code == 409


async def test_cold_adapters_are_listed_as_not_loaded_and_unknown_names_stay_404(
    admin_frontend, demo
) -> None:
    http = admin_frontend.http
    await http.post("/v1/adapters", json=_spec(), headers=AUTH)
    await http.post("/v1/adapters", json=_spec("orphan", base_model="llama"), headers=AUTH)
    models = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
    assert sorted(models) == ["demo", "org/robot", "pirate"]  # orphan's base is served nowhere
    assert models["org/robot"]["loaded"] is False
    assert models["org/robot"]["parent"] == "demo"
    assert models["org/robot"]["root"].endswith("X-Amz-Signature=***")
    assert models["pirate"]["loaded"] is True
    assert (await http.get("/v1/models/org/robot")).json()["loaded"] is False
    missing = await http.post(
        "/v1/completions", json={"model": "parrot", "prompt": "x", "max_tokens": 1}
    )
    assert missing.status_code == 404
    assert "org/robot" in missing.json()["error"]["message"]


async def test_a_desired_adapter_whose_base_model_is_gone_is_503(admin_frontend, demo) -> None:
    http = admin_frontend.http
    await http.post("/v1/adapters", json=_spec("orphan", base_model="llama"), headers=AUTH)
    answer = await http.post("/v1/completions", json={"model": "orphan", "prompt": "x"})
    assert answer.status_code == 503
    assert "'llama'" in answer.json()["error"]["message"]


async def test_delete_removes_the_desired_state_and_answers_what_it_was(
    admin_frontend, demo, etcd, namespace
) -> None:
    http = admin_frontend.http
    await http.post("/v1/adapters", json=_spec(), headers=AUTH)
    deleted = await http.delete("/v1/adapters/org/robot", headers=AUTH)
    assert deleted.status_code == 200
    assert deleted.json()["name"] == "org/robot"
    assert await etcd.get(adapter_key(namespace, lora_slug("org/robot")).encode()) is None
    assert (await http.get("/v1/adapters/org/robot")).status_code == 404
    assert (await http.delete("/v1/adapters/org/robot", headers=AUTH)).status_code == 404
    assert "org/robot" not in {m["id"] for m in (await http.get("/v1/models")).json()["data"]}


async def test_cli_apply_and_delete_go_through_the_frontend(
    admin_frontend, demo, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("DYN_ADMIN_TOKEN", TOKEN)
    argv = ["lora", "apply", "org/robot", "file:///adapters/robot", "--base-model", "demo",
            "--replicas", "all", "--pinned", "--frontend", admin_frontend.url,
            "--json", "--wait-s", "0"]  # fmt: skip
    assert await asyncio.to_thread(lorafleet, argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["replicas"], printed["pinned"]) == ("all", True)
    assert (printed["min_replicas"], printed["max_replicas"]) == ("all", "all")
    assert printed["state"] == "pending"  # the stand-in worker places nothing
    spec = admin_frontend.app.state.services.desired.get("org/robot")
    assert spec == AdapterSpec(name="org/robot", base_model="demo",
                               source=LoraSource(uri="file:///adapters/robot"),
                               replicas="all", pinned=True)  # fmt: skip
    delete = ["lora", "delete", "org/robot", "--frontend", admin_frontend.url]
    assert await asyncio.to_thread(lorafleet, delete) == 0
    assert admin_frontend.app.state.services.desired.get("org/robot") is None
    monkeypatch.delenv("DYN_ADMIN_TOKEN")
    assert await asyncio.to_thread(lorafleet, delete) == 1


async def test_cli_apply_sets_latency_targets_that_the_adapter_shows(
    admin_frontend, demo, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("DYN_ADMIN_TOKEN", TOKEN)
    argv = ["lora", "apply", "org/robot", "file:///adapters/robot", "--base-model", "demo",
            "--max-replicas", "3", "--ttft-p95-ms", "300", "--itl-p95-ms", "40",
            "--frontend", admin_frontend.url, "--json", "--wait-s", "0"]  # fmt: skip
    assert await asyncio.to_thread(lorafleet, argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["slo"] == {"ttft_p95_ms": 300.0, "itl_p95_ms": 40.0}
    assert printed["attainment"]["requests"] == 0  # nothing answered yet
    assert printed["attainment"]["copies"] == 0
    spec = admin_frontend.app.state.services.desired.get("org/robot")
    assert spec.slo == SloTargets(ttft_p95_ms=300, itl_p95_ms=40)
    argv[argv.index("300")] = "-3"
    assert await asyncio.to_thread(lorafleet, argv) == 1
    assert "slo.ttft_p95_ms" in capsys.readouterr().out
    assert admin_frontend.app.state.services.desired.get("org/robot") == spec


async def test_without_a_token_the_admin_routes_are_open(frontend) -> None:
    response = await frontend.http.post("/v1/adapters", json=_spec())
    assert response.status_code == 201
    assert "no live instance serves base model 'demo'" in response.json()["warnings"][0]


def test_the_token_never_shows_in_the_config_repr() -> None:
    config = dataclasses.replace(FrontendConfig(), admin_token=TOKEN)
    assert TOKEN not in repr(config)


async def test_the_adapter_routes_are_in_the_openapi_document(frontend) -> None:
    schema = (await frontend.http.get("/openapi.json")).json()
    operations = {op["operationId"] for path in schema["paths"].values() for op in path.values()}
    assert {"applyAdapter", "listAdapters", "getAdapter", "deleteAdapter"} <= operations
    assert "instances" in schema["components"]["schemas"]["AdapterStatus"]["properties"]


async def test_answers_without_a_token_show_no_paths_on_a_worker_s_disk(
    admin_frontend, demo
) -> None:
    http = admin_frontend.http
    chef = _spec("chef", source={"uri": "file:///srv/team-x/adapters/chef"})
    assert (await http.post("/v1/adapters", json=chef, headers=AUTH)).status_code == 201

    answers = {
        path: (await http.get(path)).text
        for path in ("/v1/models", "/v1/models/chef", "/v1/models/pirate", "/v1/models/demo",
                     "/v1/adapters", "/v1/adapters/chef")
    }  # fmt: skip

    for path, text in answers.items():
        for local in ("/srv/team-x", "/adapters/", "/models/"):  # chef, pirate, demo's paths
            assert local not in text, (path, text)
    roots = {m["id"]: m["root"] for m in json.loads(answers["/v1/models"])["data"]}
    assert roots == {"chef": "file:///***/chef", "demo": "file:///***/demo",
                     "pirate": "file:///***/pirate"}  # fmt: skip
    assert json.loads(answers["/v1/adapters/chef"])["source"]["uri"] == "file:///***/chef"
