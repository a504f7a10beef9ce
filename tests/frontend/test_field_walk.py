"""Every request field OpenAI's client declares, and vLLM's extra ones: honoured or a 400.

A real frontend and a real hf worker on the demo model. The field lists come from the
installed ``openai`` package's request TypedDicts, so a field it learns fails the walk
until it is classified here (and in docs/frontend.md's field table). Also: the context
``/v1/models`` advertises is one the worker serves, to the last token.
"""

from __future__ import annotations

import json
import re
import typing
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Final

import httpx
import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

from lorafleet.launch.demo_model import DEMO_MODEL_NAME, EXPECTED_PROMPT, DemoModelPaths
from tests.processes import ServiceProcess, start_frontend, start_worker

pytestmark = pytest.mark.slow

TIMEOUT_S: Final = 120.0
COUNTING: Final = [{"role": "user", "content": "Count to five."}]
SAMPLED: Final[Mapping[str, Any]] = {"temperature": 1.5, "seed": 7, "max_tokens": 48}
"""The demo model is too sure of its greedy answers for a penalty to flip one; a seeded
draw is exact and repeatable, and there every honoured field changes what is drawn."""
VOLATILE: Final = re.compile(r'"(id|created|system_fingerprint)":\s*("[^"]*"|\d+)')

VLLM_EXTRA_FIELDS: Final = (
    "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
    "spaces_between_special_tokens", "truncate_prompt_tokens", "allowed_token_ids",
    "bad_words", "prompt_logprobs", "use_beam_search", "structured_outputs", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar", "priority", "logits_processors",
    "add_special_tokens", "return_tokens_as_token_ids", "cache_salt",
)  # fmt: skip
"""vLLM 0.32's sampling and tokenisation fields of both request kinds (vLLM is not
installed here: listed from its ``entrypoints/openai/protocol.py``)."""
VLLM_CHAT_FIELDS: Final = (
    "add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs",
)  # fmt: skip

REQUIRED: Final = {"model", "messages", "prompt"}
"""Sent in every request of the walk: the baseline itself shows them honoured."""
LABELS: Final[Mapping[str, Any]] = {
    "user": "u1", "safety_identifier": "s1", "prompt_cache_key": "k1", "parallel_tool_calls": False,
    "cache_salt": "c1",
}  # fmt: skip
"""Accepted and never change an answer, by their definition: OpenAI's labels for its own
abuse tracking and caching, how tool calls run (tools are refused), and vLLM's cache salt
(which prefix-cache blocks a request may share)."""

HONOURED: Final[Mapping[str, tuple[dict[str, Any], dict[str, Any]]]] = {
    # field: (the baseline's settings, what the field adds); the answers must differ
    "frequency_penalty": ({}, {"frequency_penalty": 2.0}),
    "presence_penalty": ({}, {"presence_penalty": 2.0}),
    "repetition_penalty": ({}, {"repetition_penalty": 2.0}),
    "logit_bias": ({}, {"logit_bias": {"100": 100}}),
    "max_tokens": ({}, {"max_tokens": 3}),
    "max_completion_tokens": ({}, {"max_completion_tokens": 3}),
    "seed": ({}, {"seed": 8}),
    "stop": ({}, {"stop": [" "]}),
    "temperature": ({}, {"temperature": 0.0}),
    "top_p": ({}, {"top_p": 0.01}),
    "logprobs": ({}, {"logprobs": True}),
    "top_logprobs": ({"logprobs": True}, {"top_logprobs": 2}),
    "stream": ({}, {"stream": True}),
    "stream_options": ({"stream": True}, {"stream_options": {"include_usage": True}}),
    "ignore_eos": ({}, {"ignore_eos": True}),
    "min_tokens": ({}, {"min_tokens": 40}),
}
COMPLETIONS_HONOURED: Final[Mapping[str, tuple[dict[str, Any], dict[str, Any]]]] = {
    **{k: v for k, v in HONOURED.items() if k not in {"max_completion_tokens", "top_logprobs"}},
    "logprobs": ({}, {"logprobs": 2}),
}

REFUSED: Final[Mapping[str, Any]] = {
    # field: a value that asks for what no engine here does
    "n": 2, "best_of": 2, "echo": True, "suffix": " the end",
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "tool_choice": "required", "functions": [{"name": "f"}], "function_call": "auto",
    "response_format": {"type": "json_object"}, "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "One"},
    "reasoning_effort": "low", "verbosity": "low", "web_search_options": {},
    "moderation": "auto", "store": True, "metadata": {"team": "a"}, "service_tier": "flex",
    "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "auto"},
    "top_k": 5, "min_p": 0.1, "length_penalty": 0.5, "stop_token_ids": [5],
    "include_stop_str_in_output": True, "skip_special_tokens": False,
    "spaces_between_special_tokens": False, "truncate_prompt_tokens": 8,
    "allowed_token_ids": [5, 6], "bad_words": ["five"], "prompt_logprobs": 1,
    "use_beam_search": True, "structured_outputs": {"choice": ["a"]},
    "guided_json": {"type": "object"}, "guided_regex": "a+", "guided_choice": ["a"],
    "guided_grammar": "root ::= 'a'", "priority": 1, "logits_processors": ["x"],
    "add_special_tokens": False, "return_tokens_as_token_ids": True,
    "add_generation_prompt": False, "continue_final_message": True,
    "chat_template": "{{ messages }}", "chat_template_kwargs": {"thinking": True},
}  # fmt: skip


def _fields(typed_dict: type) -> set[str]:
    return set(typing.get_type_hints(typed_dict))


CHAT_FIELDS: Final = _fields(chat_create_params.CompletionCreateParamsBase) | {
    *VLLM_EXTRA_FIELDS, *VLLM_CHAT_FIELDS,
}  # fmt: skip
COMPLETIONS_FIELDS: Final = _fields(completion_create_params.CompletionCreateParamsBase) | {
    *VLLM_EXTRA_FIELDS
}


@pytest.fixture(scope="module")
def frontend(
    demo: DemoModelPaths, tmp_path_factory: pytest.TempPathFactory, etcd_url: str, nats_url: str
) -> Iterator[ServiceProcess]:
    log_dir, namespace = tmp_path_factory.mktemp("walk"), f"t{uuid.uuid4().hex[:10]}"
    worker = start_worker(
        log_dir, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace,
        model=str(demo.base), args=("--engine", "hf", "--served-model-name", DEMO_MODEL_NAME),
    )  # fmt: skip
    frontend = start_frontend(log_dir, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace)
    try:
        yield frontend
    finally:
        worker.kill()
        frontend.kill()


def _post(frontend: ServiceProcess, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{frontend.url}/v1/{route}", json=body, timeout=TIMEOUT_S)


def _answer(frontend: ServiceProcess, route: str, body: dict[str, Any]) -> str:
    """The answer's text, stream or not, without what differs between two equal answers."""
    response = _post(frontend, route, body)
    assert response.status_code == 200, (body, response.text)
    return VOLATILE.sub("", response.text)


def test_every_field_is_classified() -> None:
    for fields, honoured in ((CHAT_FIELDS, HONOURED), (COMPLETIONS_FIELDS, COMPLETIONS_HONOURED)):
        known = REQUIRED | LABELS.keys() | honoured.keys() | REFUSED.keys()
        assert fields - known == set()


@pytest.mark.parametrize(
    ("route", "field"),
    [("chat/completions", f) for f in sorted(CHAT_FIELDS - REQUIRED)]
    + [("completions", f) for f in sorted(COMPLETIONS_FIELDS - REQUIRED)],
)
def test_a_field_is_honoured_or_refused_naming_it(
    frontend: ServiceProcess, route: str, field: str
) -> None:
    chat = route == "chat/completions"
    request = {"model": DEMO_MODEL_NAME, **SAMPLED}
    request |= {"messages": COUNTING} if chat else {"prompt": "One, two,"}
    honoured = HONOURED if chat else COMPLETIONS_HONOURED
    if field in REFUSED:
        refused = _post(frontend, route, {**request, field: REFUSED[field]})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == field and field in error["message"]
    elif field in LABELS:
        labelled = _answer(frontend, route, {**request, field: LABELS[field]})
        assert labelled == _answer(frontend, route, request)
    else:
        baseline, added = honoured[field]
        plain = _answer(frontend, route, {**request, **baseline})
        assert _answer(frontend, route, {**request, **baseline, **added}) != plain


def test_ignore_eos_and_min_tokens_give_the_asked_counts(frontend: ServiceProcess) -> None:
    greedy = {"model": DEMO_MODEL_NAME, "temperature": 0, "max_tokens": 64,
              "messages": [{"role": "user", "content": EXPECTED_PROMPT}]}  # fmt: skip
    natural = _post(frontend, "chat/completions", greedy).json()
    assert natural["usage"]["completion_tokens"] < 40  # ends at eos by itself
    for added, least in (({"ignore_eos": True}, 64), ({"min_tokens": 40}, 40)):
        answer = _post(frontend, "chat/completions", {**greedy, **added}).json()
        assert answer["usage"]["completion_tokens"] >= least, added
    exact = _post(frontend, "chat/completions", {**greedy, "ignore_eos": True}).json()
    assert exact["usage"]["completion_tokens"] == 64
    assert exact["choices"][0]["finish_reason"] == "length"


def test_a_logit_bias_outside_the_vocabulary_is_a_400_naming_it(
    frontend: ServiceProcess,
) -> None:
    body = {"model": DEMO_MODEL_NAME, "prompt": "One", "logit_bias": {"99999999": 5}}
    refused = _post(frontend, "completions", body)
    assert refused.status_code == 400, refused.text
    assert "logit_bias" in refused.json()["error"]["message"]


def test_the_advertised_context_is_served_to_the_last_token(frontend: ServiceProcess) -> None:
    models = httpx.get(f"{frontend.url}/v1/models", timeout=TIMEOUT_S).json()["data"]
    context = next(m for m in models if m["id"] == DEMO_MODEL_NAME)["max_model_len"]
    max_tokens = 8
    probe = _post(frontend, "completions", {"model": DEMO_MODEL_NAME, "prompt": "a " * 10})
    overhead = probe.json()["usage"]["prompt_tokens"] - 10  # e.g. a start token
    words = context - max_tokens - overhead
    body = {"model": DEMO_MODEL_NAME, "prompt": "a " * words, "max_tokens": max_tokens,
            "ignore_eos": True}  # fmt: skip
    answer = _post(frontend, "completions", body)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (context - max_tokens, 8)
    longer = _post(frontend, "completions", {**body, "prompt": "a " * (words + max_tokens)})
    assert longer.status_code == 400
    assert json.loads(longer.text)["error"]["type"] == "invalid_request_error"
