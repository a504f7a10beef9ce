"""etcd with authentication and client TLS: the whole path works, and strangers are refused.

Certificates are made here with ``cryptography`` (``lorafleet/launch/tls_files.py``); etcd gets a
root user and a lorafleet user whose role reaches only ``v1/``. A refusal is one clear
line naming the server and the variable to check, and is marked permanent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from lorafleet.discovery.client import EtcdClient, connect_etcd
from lorafleet.discovery.errors import EtcdRefusedError, EtcdUnavailableError
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.launch.etcd_auth import EtcdUser, enable_etcd_auth
from lorafleet.launch.local_servers import LocalServer, start_etcd
from lorafleet.launch.tls_files import TlsFiles, make_tls_files
from tests.etcd_scenarios import ADAPTER, MODEL, start_fleet
from tests.processes import frontend_start_failure

pytestmark = pytest.mark.slow

USER = EtcdUser(password="lorafleet-test-password")


@dataclass
class SecureEtcd:
    """A running etcd, the TLS files it trusts (if any) and the settings that reach it."""

    server: LocalServer
    tls: TlsFiles | None
    settings: EtcdSettings


def _secure_etcd(root: Path, *, tls: bool) -> SecureEtcd:
    files = make_tls_files(root / "tls") if tls else None
    server = start_etcd(root / "etcd", tls=files)
    enable_etcd_auth(server.url, root_password="root-test-password", user=USER, tls=files)
    settings = EtcdSettings(
        endpoints=(server.url,), username=USER.username, password=USER.password,
        ca_path=files and files.ca_cert, client_cert_path=files and files.client_cert,
        client_key_path=files and files.client_key,
    )  # fmt: skip
    return SecureEtcd(server, files, settings)


@pytest.fixture
def tls_auth_etcd(tmp_path: Path) -> Iterator[SecureEtcd]:
    """etcd with client TLS (mutual) and authentication on."""
    secure = _secure_etcd(tmp_path, tls=True)
    yield secure
    secure.server.stop()


@pytest.fixture
def auth_etcd(tmp_path: Path) -> Iterator[SecureEtcd]:
    """etcd with authentication on, over plain HTTP."""
    secure = _secure_etcd(tmp_path, tls=False)
    yield secure
    secure.server.stop()


async def test_load_publish_list_and_chat_work_with_etcd_auth_and_tls(
    tmp_path: Path, tls_auth_etcd: SecureEtcd, nats_url: str, namespace: str
) -> None:
    env = tls_auth_etcd.settings.env()
    fleet = await start_fleet(
        tmp_path, etcd_endpoints=tls_auth_etcd.server.url, nats_url=nats_url,
        namespace=namespace, env=env,
    )  # fmt: skip  # returns once /v1/models lists the model and the adapter
    try:
        etcd = await connect_etcd(tls_auth_etcd.settings)
        cards = await etcd.get_prefix(f"v1/mdc/{namespace}/".encode())
        await etcd.close()
        assert len(list(cards)) == 2  # the base model's card and the adapter's
        client = openai.AsyncOpenAI(
            base_url=f"{fleet.frontend.url}/v1", api_key="unused", max_retries=0
        )
        async with client:
            for model in (MODEL, ADAPTER):
                reply = await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
                assert reply.choices[0].message.content
    finally:
        fleet.stop()


async def test_a_client_without_credentials_is_refused_naming_the_variables(
    auth_etcd: SecureEtcd,
) -> None:
    with pytest.raises(EtcdRefusedError) as refused:
        await connect_etcd(auth_etcd.server.url)
    assert refused.value.permanent
    assert f"etcd at {auth_etcd.server.url} refused connect" in str(refused.value)
    assert "ETCD_AUTH_USERNAME" in str(refused.value)


async def test_a_wrong_password_is_refused_naming_the_variables(auth_etcd: SecureEtcd) -> None:
    settings = EtcdSettings(
        endpoints=(auth_etcd.server.url,), username=USER.username, password="wrong"
    )
    with pytest.raises(EtcdRefusedError, match="check ETCD_AUTH_USERNAME and ETCD_AUTH_PASSWORD"):
        await connect_etcd(settings)


async def test_a_client_that_trusts_another_ca_is_refused_naming_etcd_auth_ca(
    tmp_path: Path, tls_auth_etcd: SecureEtcd
) -> None:
    stranger = make_tls_files(tmp_path / "another-ca")
    settings = EtcdSettings(
        endpoints=(tls_auth_etcd.server.url,), username=USER.username, password=USER.password,
        ca_path=stranger.ca_cert, client_cert_path=stranger.client_cert,
        client_key_path=stranger.client_key,
    )  # fmt: skip
    with pytest.raises(EtcdRefusedError, match="check ETCD_AUTH_CA") as refused:
        await connect_etcd(settings)
    assert refused.value.permanent
    assert tls_auth_etcd.server.url in str(refused.value)


def test_a_worker_without_a_client_certificate_exits_1_with_one_clear_line(
    tls_auth_etcd: SecureEtcd, nats_url: str
) -> None:
    stderr = frontend_start_failure({
        **tls_auth_etcd.settings.env(), "NATS_SERVER": nats_url,
        "ETCD_AUTH_CLIENT_CERT": "", "ETCD_AUTH_CLIENT_KEY": "",
    })  # fmt: skip
    assert f"etcd at {tls_auth_etcd.server.url} refused connect" in stderr
    assert "ETCD_AUTH_CLIENT_CERT" in stderr


async def test_the_lease_survives_an_etcd_restart_that_forgets_every_auth_token(
    auth_etcd: SecureEtcd, namespace: str
) -> None:
    etcd = await connect_etcd(auth_etcd.settings)
    keeper = await LeaseKeeper.grant(etcd, 5)  # kept alive through the restart, with margin
    await keeper.put(f"v1/instances/{namespace}/a", b"1")
    await asyncio.to_thread(auth_etcd.server.restart)  # simple tokens die with the process
    async with asyncio.timeout(10):  # the channel is back (status needs no token) ...
        while not await _answers(etcd):
            await asyncio.sleep(0.05)
    # ... and a put renews the token. The first put after the restart may still time out on
    # a loaded machine (etcd checks the password with bcrypt); a worker's next put retries,
    # and so does this one, for a generous while.
    async with asyncio.timeout(60):
        while not await _puts(keeper, f"v1/instances/{namespace}/b"):
            await asyncio.sleep(0.2)
    got = await etcd.get(f"v1/instances/{namespace}/a".encode())
    assert got is not None and got.lease == keeper.lease_id
    await keeper.aclose()
    await etcd.close()


async def _puts(keeper: LeaseKeeper, key: str) -> bool:
    """Whether a put under ``keeper``'s lease went through (False: etcd was unavailable)."""
    try:
        await keeper.put(key, b"2")
    except EtcdUnavailableError:
        return False
    return True


async def _answers(etcd: EtcdClient) -> bool:
    try:
        with etcd.errors("status"):
            await etcd.status()
    except EtcdUnavailableError:
        return False
    return True


async def test_a_watch_under_etcd_auth_sees_what_is_put_after_it_began(
    auth_etcd: SecureEtcd,
) -> None:
    """How a frontend learns of a worker that starts after it: etcd checks the watch's token,
    and cancelled every watch when the streaming calls went without one."""
    watching = await connect_etcd(auth_etcd.settings)
    writing = await connect_etcd(auth_etcd.settings)
    try:
        watch = await watching.watch_prefix(b"v1/mdc/watched/")
        await writing.put(b"v1/mdc/watched/card", b"{}")

        async def first_event() -> tuple[str, bytes]:
            async for event in watch:
                return event.kind, event.kv.key
            raise AssertionError("the watch ended without an event")

        assert await asyncio.wait_for(first_event(), timeout=30) == ("PUT", b"v1/mdc/watched/card")
        await watch.cancel()
    finally:
        await watching.close()
        await writing.close()
