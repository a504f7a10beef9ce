"""The fast path answers the generate routes exactly as the Litestar controllers do.

``POST /v1/chat/completions`` and ``/v1/completions`` go through ``frontend.fast_path``;
the same routes with a trailing slash reach Litestar's controllers. Every body below,
good or bad, whole or streamed, is sent both ways and must get the same status,
headers and body (its ``created`` time aside). Real HTTP, etcd and NATS, a stand-in
worker.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.frontend.conftest import wait_for_models
from tests.frontend.stand_in import StandInWorker

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
_MESSAGES = [{"role": "user", "content": "say hi"}]
_USAGE = {"include_usage": True}
_CREATED = re.compile(rb'"created":\d+')
_COMPARED_HEADERS = ("content-type", "content-length", "x-request-id", "cache-control", "allow")


def _json(**fields: object) -> bytes:
    return json.dumps(fields).encode()


BODIES = [
    (CHAT, _json(model="demo", messages=_MESSAGES, max_tokens=3)),
    (CHAT, _json(model="demo", messages=_MESSAGES, max_tokens="3")),  # lax: a numeric string
    (CHAT, _json(model="demo", messages=_MESSAGES, max_tokens=2, stream=True)),
    (CHAT, _json(model="demo", messages=_MESSAGES, stream=True, stream_options=_USAGE)),
    (CHAT, _json(model="demo", messages=_MESSAGES, logprobs=True, top_logprobs=2)),
    (CHAT, _json(model="nope", messages=_MESSAGES)),
    (CHAT, _json(model="demo", messages=_MESSAGES, max_tokens="x")),
    (CHAT, _json(model="demo", messages=[])),
    (CHAT, _json(model="demo")),
    (CHAT, _json(model="demo", messages=_MESSAGES, temperature=-1)),
    (CHAT, b"{not json"),
    (CHAT, b""),
    (CHAT, b"null"),
    (CHAT, b"[" * 100 + b"]" * 100),
    (COMPLETIONS, _json(model="demo", prompt="hi", max_tokens=2)),
    (COMPLETIONS, _json(model="demo", prompt=["hi"], max_tokens=2, stream=True)),
    (COMPLETIONS, _json(model="nope", prompt="hi", stream=True)),
    (COMPLETIONS, _json(model="demo")),
]


@pytest.mark.parametrize(("path", "body"), BODIES)
async def test_the_fast_path_answers_as_the_controllers_do(
    frontend, workers, nats_url, etcd, namespace, path, body
) -> None:
    workers.append(await StandInWorker(nats_url, etcd, namespace, "demo").start())
    await wait_for_models(frontend, {"demo"})
    answers = []
    for route in (path, path + "/"):  # the fast path, then Litestar's controller
        response = await frontend.http.post(
            route, content=body, headers={"content-type": "application/json", "x-request-id": "r1"}
        )
        headers = {name: response.headers.get(name) for name in _COMPARED_HEADERS}
        answers.append((response.status_code, headers, _CREATED.sub(b"", response.content)))
    assert answers[0] == answers[1]
