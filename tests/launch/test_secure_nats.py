"""NATS with ``deploy/nats/auth.conf``: who may connect, read and write which subjects.

The passwords are made by ``launch.secure_nats`` as ``lorafleet up --secure`` makes them.
"""

from __future__ import annotations

import asyncio
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import openai
import pytest
from nats.aio.msg import Msg

from lorafleet.discovery import flush_subscriptions
from lorafleet.discovery.errors import NatsAuthError
from lorafleet.discovery.keys import kv_events_subject, nats_subject
from lorafleet.discovery.nats_connection import WORKER_INBOX_PREFIX, NatsConnection
from lorafleet.discovery.nats_settings import NatsSettings
from lorafleet.launch.local_servers import LocalServer, free_port
from lorafleet.launch.secure_nats import NatsCredentials, nats_credentials, start_secure_nats
from tests.launch.test_cluster import STOP_WAIT_S, _read_until_ready
from tests.nats_faults import fleet

WAIT_S = 10.0


@pytest.fixture
def credentials(tmp_path: Path) -> NatsCredentials:
    return nats_credentials(tmp_path / "state")


@pytest.fixture
def secure_nats(
    tmp_path: Path, credentials: NatsCredentials, namespace: str
) -> Iterator[LocalServer]:
    server = start_secure_nats(tmp_path / "nats", credentials, namespace=namespace)
    yield server
    server.stop()


def _settings(server: LocalServer, credentials: NatsCredentials, role: str) -> NatsSettings:
    env = {"NATS_SERVER": server.url, **credentials.client_env(role)}
    return NatsSettings.from_env(None, env)


def test_credentials_are_made_once_and_readable_by_the_owner_only(tmp_path: Path) -> None:
    first = nats_credentials(tmp_path / "state")
    mode = (tmp_path / "state" / "secure" / "nats.json").stat().st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert nats_credentials(tmp_path / "state") == first
    assert first.passwords["worker"] not in repr(first)


async def test_an_anonymous_client_cannot_connect(secure_nats: LocalServer) -> None:
    with pytest.raises(NatsAuthError, match="NATS_AUTH_"):
        await NatsConnection.connect(NatsSettings(servers=(secure_nats.url,)), name="anonymous")


FORBIDDEN = [("frontend", "worker"), ("frontend", ">"), ("worker", "_INBOX.>"), ("worker", ">")]


@pytest.mark.parametrize(("role", "forbidden"), FORBIDDEN)
async def test_a_role_cannot_subscribe_to_what_it_must_not_read(
    secure_nats: LocalServer, credentials: NatsCredentials, namespace: str,
    role: str, forbidden: str,
) -> None:  # fmt: skip
    worker_subject = nats_subject(namespace, "backend", "generate", 0x1234)
    subject = worker_subject if forbidden == "worker" else forbidden
    denied = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            denied.set()

    password = credentials.passwords[role]
    spy = await nats.connect(secure_nats.url, user=role, password=password, error_cb=on_error)
    seen: list[bytes] = []

    async def spy_on(msg: Msg) -> None:
        seen.append(msg.data)

    try:
        await spy.subscribe(subject, cb=spy_on)
        await asyncio.wait_for(denied.wait(), WAIT_S)
        await _request_and_reply(secure_nats, credentials, worker_subject)
        await spy.flush()  # anything routed to the spy arrived before this round trip
    finally:
        await spy.close()
    assert seen == []


async def test_a_frontend_reads_the_workers_kv_events(
    secure_nats: LocalServer, credentials: NatsCredentials, namespace: str
) -> None:
    """Prefix routing needs it: workers publish block events, every frontend reads them."""
    subject = kv_events_subject(namespace)
    worker = await nats.connect(secure_nats.url, user="worker",
                                password=credentials.passwords["worker"])  # fmt: skip
    frontend = await nats.connect(secure_nats.url, user="frontend",
                                  password=credentials.passwords["frontend"])  # fmt: skip
    try:
        events = await frontend.subscribe(subject)
        await flush_subscriptions(frontend)
        await worker.publish(subject, b"batch")
        assert (await events.next_msg(timeout=WAIT_S)).data == b"batch"
    finally:
        await worker.close()
        await frontend.close()


async def _request_and_reply(
    server: LocalServer, credentials: NatsCredentials, worker_subject: str
) -> None:
    """A request and its reply flow: the worker gets the prompt, the frontend the tokens."""
    worker_settings = _settings(server, credentials, "worker")
    frontend_settings = _settings(server, credentials, "frontend")
    async with (
        await NatsConnection.connect(
            worker_settings, name="worker", inbox_prefix=WORKER_INBOX_PREFIX
        ) as worker,
        await NatsConnection.connect(frontend_settings, name="frontend") as frontend,
    ):

        async def serve(msg: Msg) -> None:
            await msg.respond(b"generated tokens")

        await worker.client.subscribe(worker_subject, cb=serve)
        await worker.client.request(worker_subject, b"self-check", timeout=WAIT_S)  # as workers do
        answer = await frontend.client.request(worker_subject, b"prompt", timeout=WAIT_S)
        assert answer.data == b"generated tokens"


def test_worker_and_frontend_serve_chat_with_their_own_credentials(
    tmp_path: Path, etcd_url: str, namespace: str,
    secure_nats: LocalServer, credentials: NatsCredentials,
) -> None:  # fmt: skip
    with fleet(
        tmp_path, etcd_url=etcd_url, nats_url=secure_nats.url, namespace=namespace,
        worker_env=credentials.client_env("worker"),
        frontend_env=credentials.client_env("frontend"),
    ) as running:  # fmt: skip
        completion = running.chat()
        assert completion.choices[0].message.content
        assert running.worker_health().json()["nats"] == "connected"


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_up_secure_serves_chat_and_refuses_anonymous_nats_clients(tmp_path: Path) -> None:
    state, http_port = tmp_path / "state", free_port()
    argv = [
        str(Path(sys.executable).parent / "lorafleet"), "up", "--secure", "--engine", "mocker",
        "--model", "demo", "--http-port", str(http_port), "--system-port", str(free_port()),
        "--state-dir", str(state), "--namespace", f"secure{http_port}",
    ]  # fmt: skip
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        await asyncio.to_thread(_read_until_ready, up)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused",
                               max_retries=0)  # fmt: skip
        messages = [{"role": "user", "content": "tell me a story"}]
        completion = await asyncio.to_thread(
            client.chat.completions.create, model="demo", messages=messages, max_tokens=4
        )
        assert completion.choices[0].message.content
        nats_url = _nats_url(state / "servers" / "nats.log")
        with pytest.raises(NatsAuthError):
            await NatsConnection.connect(NatsSettings(servers=(nats_url,)), name="anonymous")
        assert stat.S_IMODE((state / "secure" / "nats.json").stat().st_mode) == 0o600
    finally:
        up.send_signal(signal.SIGINT)
        exit_code = await asyncio.to_thread(up.wait, STOP_WAIT_S)
    assert exit_code == 0


def _nats_url(log: Path) -> str:
    found = re.search(r"Listening for client connections on (\S+)", log.read_text())
    assert found, log.read_text()
    return f"nats://{found.group(1)}"
