"""OpenAI fields are served or refused, never dropped; request ids, access log, /docs, metrics.

A real ``python -m lorafleet.frontend`` and a real hf worker on the demo model serve the whole
module, asked through the official ``openai`` client (``max_retries=0``). Both log
JSON so that the tests can read the lines about one request.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from lorafleet.launch.demo_model import DEMO_MODEL_NAME, EXPECTED_PROMPT, DemoModelPaths
from tests.processes import ServiceProcess, start_frontend, start_worker

pytestmark = pytest.mark.slow

JSON_LOGS = {"LOG_FORMAT": "json"}
WORKER_ENV = {**JSON_LOGS, "DYN_LORA_ENABLED": "true"}  # the adapter series exist with LoRA on
LOG_TIMEOUT_S = 15.0
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
GREEDY = {"model": DEMO_MODEL_NAME, "temperature": 0, "max_tokens": 12}
MESSAGES = [{"role": "user", "content": EXPECTED_PROMPT}]
DOCS_METRICS = Path(__file__).parents[2] / "docs" / "metrics.md"
DASHBOARD = Path(__file__).parents[2] / "deploy/monitoring/grafana/dashboards/lorafleet.json"
OUR_SERIES = re.compile(r"(?:vllm:|lorafleet_)[a-zA-Z0-9_:]+")


@pytest.fixture(scope="module")
def fleet(
    demo: DemoModelPaths, tmp_path_factory: pytest.TempPathFactory, etcd_url: str, nats_url: str
) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    log_dir, namespace = tmp_path_factory.mktemp("fields"), f"t{uuid.uuid4().hex[:10]}"
    worker = start_worker(
        log_dir, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace,
        model=str(demo.base), env=WORKER_ENV,
        args=("--engine", "hf", "--served-model-name", DEMO_MODEL_NAME, "--enable-lora"),
    )  # fmt: skip
    frontend = start_frontend(
        log_dir, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace, env=JSON_LOGS
    )
    try:
        yield worker, frontend
    finally:
        worker.kill()
        frontend.kill()


@pytest.fixture
def client(fleet: tuple[ServiceProcess, ServiceProcess]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{fleet[1].url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def _lines(process: ServiceProcess) -> list[dict[str, object]]:
    lines = []
    for line in process.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def _logged(process: ServiceProcess, event: str, request_id: str) -> dict[str, object]:
    """The first ``event`` line whose request id holds ``request_id``, once it is written."""
    deadline = time.monotonic() + LOG_TIMEOUT_S
    while True:
        for line in _lines(process):
            if line.get("event") == event and request_id in str(line.get("request_id")):
                return line
        assert time.monotonic() < deadline, f"no {event!r} line:\n{process.log_tail()}"
        time.sleep(0.05)


def test_chat_returns_logprobs_with_the_top_alternatives(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        **GREEDY, messages=MESSAGES, logprobs=True, top_logprobs=3
    )
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    assert "".join(item.token for item in choice.logprobs.content) == choice.message.content
    for item in choice.logprobs.content:
        assert item.logprob <= 0
        assert len(item.top_logprobs) == 3
        # Greedy: each chosen token is the likeliest one.
        assert item.top_logprobs[0].token == item.token
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob)


def test_chat_without_logprobs_returns_none(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(**GREEDY, messages=MESSAGES)
    assert answer.choices[0].logprobs is None


def test_streamed_completions_carry_logprobs_per_chunk(client: openai.OpenAI) -> None:
    tokens: list[str] = []
    text = ""
    for chunk in client.completions.create(
        **GREEDY, prompt=EXPECTED_PROMPT, logprobs=2, stream=True
    ):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                assert all(len(top) == 2 for top in choice.logprobs.top_logprobs or [])
                tokens += choice.logprobs.tokens or []
    assert tokens and "".join(tokens) == text


def test_penalties_change_the_seeded_answer(client: openai.OpenAI) -> None:
    # The demo model is so sure of its greedy answers (next best token ~6 nats behind) that
    # no penalty in OpenAI's range (at most 2) flips one; sampling at a fixed seed is exact
    # and repeatable, and there every penalty changes what is drawn.
    counting = [{"role": "user", "content": "Count to five."}]
    request = {**GREEDY, "temperature": 1.5, "seed": 7, "max_tokens": 48, "messages": counting}
    plain = client.chat.completions.create(**request).choices[0].message.content
    assert client.chat.completions.create(**request).choices[0].message.content == plain
    for penalty in (
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 2.0}},
    ):
        penalised = client.chat.completions.create(**request, **penalty)
        assert penalised.choices[0].message.content != plain, penalty


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        ("tool_choice", "required"),
        ("response_format", {"type": "json_object"}),
        ("n", 2),
    ],
)
def test_an_unsupported_field_is_a_400_naming_it_and_the_engine(
    client: openai.OpenAI, field: str, value: object
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**GREEDY, messages=MESSAGES, extra_body={field: value})
    assert refused.value.status_code == 400
    assert field in refused.value.message
    assert "'hf'" in refused.value.message


def test_request_id_round_trips_and_tags_the_worker_and_access_lines(
    fleet: tuple[ServiceProcess, ServiceProcess], client: openai.OpenAI
) -> None:
    worker, frontend = fleet
    request_id = f"trace-{uuid.uuid4().hex}"
    raw = client.chat.completions.with_raw_response.create(
        **GREEDY, messages=MESSAGES, extra_headers={"x-request-id": request_id}
    )
    assert raw.headers["x-request-id"] == request_id
    answer = raw.parse()
    assert request_id in answer.id
    # Both lines are written just after the answer left: wait for them.
    served = _logged(worker, "request served", request_id)
    assert served["completion_tokens"] == answer.usage.completion_tokens
    access = _logged(frontend, "access", request_id)
    assert access["level"] == "info"
    assert access["method"] == "POST" and access["route"] == "/v1/chat/completions"
    assert access["model"] == DEMO_MODEL_NAME and access["status"] == 200
    assert access["prompt_tokens"] == answer.usage.prompt_tokens
    assert access["completion_tokens"] == answer.usage.completion_tokens


def test_a_refused_request_has_its_access_line_with_the_status(
    fleet: tuple[ServiceProcess, ServiceProcess], client: openai.OpenAI
) -> None:
    request_id = f"refused-{uuid.uuid4().hex}"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            **GREEDY, messages=MESSAGES, n=2, extra_headers={"x-request-id": request_id}
        )
    access = _logged(fleet[1], "access", request_id)
    assert access["status"] == 400 and access["model"] == DEMO_MODEL_NAME
    assert access["completion_tokens"] == 0


def test_a_hostile_request_id_is_cleaned_and_bounded(
    fleet: tuple[ServiceProcess, ServiceProcess],
) -> None:
    sent = "a\tb<script>" + "x" * 1000
    response = httpx.get(f"{fleet[1].url}/v1/models", headers={"x-request-id": sent})
    echoed = response.headers["x-request-id"]
    assert echoed.startswith("abscript") and len(echoed) == 128


def test_a_request_without_an_id_gets_a_new_one(
    fleet: tuple[ServiceProcess, ServiceProcess],
) -> None:
    first = httpx.get(f"{fleet[1].url}/v1/models").headers["x-request-id"]
    second = httpx.get(f"{fleet[1].url}/v1/models").headers["x-request-id"]
    assert re.fullmatch("[0-9a-f]{32}", first) and first != second


def test_docs_serves_the_openapi_ui_and_the_document_lists_the_new_fields(
    fleet: tuple[ServiceProcess, ServiceProcess],
) -> None:
    page = httpx.get(f"{fleet[1].url}/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower()
    schema = httpx.get(f"{fleet[1].url}/openapi.json").json()["components"]["schemas"]
    chat = schema["ChatCompletionRequest"]["properties"]
    assert {"logprobs", "top_logprobs", "frequency_penalty", "tools"} <= chat.keys()


def documented_series() -> dict[str, set[str]]:
    """The series ``docs/metrics.md`` lists, by where they come from (worker, frontend)."""
    found: dict[str, set[str]] = {"worker": set(), "frontend": set()}
    for row in re.findall(r"^\| `([^`]+)` \| (worker|frontend) \|", DOCS_METRICS.read_text(), re.M):
        found[row[1]].add(row[0])
    return found


def test_metrics_after_traffic_hold_every_documented_series(
    fleet: tuple[ServiceProcess, ServiceProcess], client: openai.OpenAI
) -> None:
    client.chat.completions.create(**GREEDY, messages=MESSAGES)
    worker, frontend = fleet
    documented = documented_series()
    assert documented["worker"] and documented["frontend"]
    for process, names in ((worker, documented["worker"]), (frontend, documented["frontend"])):
        exposed = exported_names(httpx.get(f"{process.url}/metrics").text)
        assert names <= exposed, f"missing on the {process.log_path.name}: {names - exposed}"


def exported_names(text: str) -> set[str]:
    """Every series name a Prometheus text exposition declares (``# TYPE``) or samples;
    histograms also under their family name. A labelled family that no request has touched
    yet (an alias's, a tenant's) is declared with no sample: it counts as exported."""
    lines = text.splitlines()
    names = {line.split("{")[0].split(" ")[0] for line in lines if line[:1] != "#"}
    names |= {line.split(" ")[2] for line in lines if line.startswith("# TYPE ")}
    for name in list(names):
        for suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(suffix):
                names.add(name.removesuffix(suffix))
    return names - {""}


def dashboard_series() -> set[str]:
    """Every series the checked-in Grafana dashboard queries (histograms by family name)."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    names = {name for expr in exprs for name in OUR_SERIES.findall(expr)}
    return {name.removesuffix("_bucket") for name in names}


def test_every_series_the_dashboard_queries_is_exported(
    fleet: tuple[ServiceProcess, ServiceProcess], client: openai.OpenAI
) -> None:
    client.chat.completions.create(**GREEDY, messages=MESSAGES)
    exposed = set().union(
        *(exported_names(httpx.get(f"{process.url}/metrics").text) for process in fleet)
    )
    queried = dashboard_series()
    assert len(queried) >= 10
    assert queried <= exposed, f"the dashboard queries what nothing exports: {queried - exposed}"
