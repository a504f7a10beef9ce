"""The NATS connection helper on real nats-servers: reconnects, clear refusals, loss noticed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from lorafleet.discovery.errors import NatsAuthError, NatsConnectError
from lorafleet.discovery.nats_connection import NatsConnection, NatsState, flush_subscriptions
from lorafleet.discovery.nats_settings import NatsSettings
from lorafleet.launch.local_servers import LocalServer, free_port, start_nats
from lorafleet.launch.tls_files import TlsFiles, make_tls_files

WAIT_S = 20.0


async def _until(condition, timeout_s: float = WAIT_S) -> None:  # type: ignore[no-untyped-def]
    """Wait for a state change of the connection (polled: nats-py has no awaitable for it)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[LocalServer]:
    server = start_nats(tmp_path / "nats")
    yield server
    server.stop()


async def test_unreachable_nats_is_a_retryable_error_naming_nats_server() -> None:
    settings = NatsSettings(servers=(f"nats://127.0.0.1:{free_port()}",))
    with pytest.raises(NatsConnectError, match="NATS_SERVER") as caught:
        await NatsConnection.connect(settings, name="test")
    assert not caught.value.permanent
    assert caught.value.code == "nats_unavailable"


async def test_the_connection_comes_back_after_the_server_restarts(own_nats: LocalServer) -> None:
    conn = await NatsConnection.connect(NatsSettings(servers=(own_nats.url,)), name="test")
    async with conn:
        received: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_message(msg) -> None:  # type: ignore[no-untyped-def]
            await received.put(msg.data)

        await conn.client.subscribe("restart.test", cb=on_message)
        own_nats.stop(kill=True)
        await _until(lambda: conn.state is NatsState.RECONNECTING)
        assert not await conn.wait_connected(0.05)
        await asyncio.to_thread(own_nats.restart)
        assert await conn.wait_connected(WAIT_S)
        await conn.client.publish("restart.test", b"after")  # the subscription was restored
        assert await asyncio.wait_for(received.get(), WAIT_S) == b"after"


async def test_the_first_reachable_server_of_a_list_is_used(own_nats: LocalServer) -> None:
    dead = f"nats://127.0.0.1:{free_port()}"
    settings = NatsSettings(servers=(dead, own_nats.url))
    async with await NatsConnection.connect(settings, name="test") as conn:
        assert conn.server == f"127.0.0.1:{own_nats.port}"


def _password_server(tmp_path: Path, password: str, port: int | None = None) -> LocalServer:
    config = tmp_path / "users.conf"
    config.write_text(f'authorization {{ user: app, password: "{password}" }}\n')
    return start_nats(tmp_path / "nats-auth", port=port, config=config)


async def test_a_wrong_password_is_permanent_and_names_the_variables(tmp_path: Path) -> None:
    server = _password_server(tmp_path, "right")
    try:
        settings = NatsSettings(servers=(server.url,), username="app", password="wrong")
        with pytest.raises(NatsAuthError) as caught:
            await NatsConnection.connect(settings, name="test")
        assert caught.value.permanent
        assert server.url in caught.value.message
        assert "NATS_AUTH_USERNAME and NATS_AUTH_PASSWORD" in caught.value.message
        assert "wrong" not in caught.value.message
    finally:
        server.stop()


async def test_a_connection_the_library_closes_for_good_calls_on_lost(tmp_path: Path) -> None:
    """A server ``-ERR`` that nats-py answers by closing for good (here: too many
    subscriptions) must reach the owner, which then exits non-zero."""
    config = tmp_path / "limits.conf"
    config.write_text("max_subscriptions: 1\n")
    server = start_nats(tmp_path / "nats-limits", config=config)
    lost = asyncio.Event()
    try:
        settings = NatsSettings(servers=(server.url,))
        conn = await NatsConnection.connect(settings, name="test", on_lost=lost.set)
        await conn.client.subscribe("first")
        await conn.client.subscribe("second")
        await asyncio.wait_for(lost.wait(), WAIT_S)
        assert conn.state is NatsState.CLOSED
        await conn.aclose()
    finally:
        server.stop()


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return make_tls_files(tmp_path / "tls")


def _tls_server(tmp_path: Path, tls: TlsFiles, *, verify_clients: bool = False) -> LocalServer:
    args = ["--tls", "--tlscert", str(tls.server_cert), "--tlskey", str(tls.server_key)]
    if verify_clients:
        args += ["--tlsverify", "--tlscacert", str(tls.ca_cert)]
    return start_nats(tmp_path / "nats-tls", extra_args=args)


async def test_an_unknown_ca_is_permanent_and_names_the_tls_variable(
    tmp_path: Path, tls: TlsFiles
) -> None:
    server = _tls_server(tmp_path, tls)
    other_ca = make_tls_files(tmp_path / "other").ca_cert
    try:
        with pytest.raises(NatsAuthError, match="NATS_TLS_CA_CERT_PATH") as caught:
            await NatsConnection.connect(
                NatsSettings(servers=(server.url,), tls_ca_cert=other_ca), name="test"
            )
        assert caught.value.permanent
        settings = NatsSettings(servers=(server.url,), tls_ca_cert=tls.ca_cert)
        async with await NatsConnection.connect(settings, name="test") as conn:
            assert conn.is_connected
    finally:
        server.stop()


async def test_mutual_tls_needs_the_client_certificate(tmp_path: Path, tls: TlsFiles) -> None:
    server = _tls_server(tmp_path, tls, verify_clients=True)
    try:
        with pytest.raises(NatsConnectError):
            await NatsConnection.connect(
                NatsSettings(servers=(server.url,), tls_ca_cert=tls.ca_cert), name="test"
            )
        settings = NatsSettings(
            servers=(server.url,), tls_ca_cert=tls.ca_cert,
            tls_client_cert=tls.client_cert, tls_client_key=tls.client_key,
        )  # fmt: skip
        async with await NatsConnection.connect(settings, name="test") as conn:
            assert conn.is_connected
    finally:
        server.stop()


async def test_flushed_subscriptions_are_known_to_the_server(tmp_path: Path) -> None:
    """A worker announces itself in etcd right after subscribing: a frontend's first request
    must find the subscription, not NATS's "no responders" (issue 39, item 12)."""
    traced = start_nats(tmp_path / "nats", extra_args=["-V"])  # logs each command it reads
    client = await nats.connect(traced.url)
    try:
        await client.subscribe("flush.check")
        await flush_subscriptions(client)
        lines = traced.log_path.read_text().splitlines()
    finally:
        await client.close()
        traced.stop()
    sub = next(line for line in lines if "<<- [SUB flush.check" in line)
    cid = sub.split(" - ")[1]  # "cid:N": this client's commands, not the health checks'
    after_sub = lines[lines.index(sub) + 1 :]
    # The server answered a PING read after the SUB: it held the subscription before its PONG.
    assert any(f" - {cid} - " in line and "<<- [PING]" in line for line in after_sub), lines
