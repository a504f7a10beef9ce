"""An instance the frontend cannot reach over NATS while etcd still lists it (issue 27, case 5).

A MUTE stand-in is such an instance: its subject is subscribed, nothing answers, as with a
worker behind a stalled NATS route. ``unmute()`` is the route healing. The frontend keeps
it out of routing until it answers a ping (``frontend.reachability``), not on a timer:
``quarantine_s=0`` here, so the old timed quarantine let it back at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable

import pytest

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from lorafleet.frontend.dispatcher import DispatchSettings
from tests.frontend.conftest import FAST_DISPATCH, RunningFrontend, run_frontend
from tests.frontend.stand_in import Behaviour, StandInWorker

CHAT = "/v1/chat/completions"
LONG_STALL = DispatchSettings(stall_s=60.0, ping_timeout_s=0.5)
"""A stall longer than the client's patience (10 s): a request may not wait one out."""
BODY = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
async def frontend(etcd_url: str, nats_url: str, namespace: str) -> AsyncIterator[RunningFrontend]:
    """A frontend whose timed quarantine is 0 s: only a ping can keep an instance out."""
    config = FrontendConfig(
        namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url), nats_server=nats_url,
        dispatch=dataclasses.replace(FAST_DISPATCH, quarantine_s=0.0),
    )  # fmt: skip
    async with run_frontend(config) as running:
        yield running


async def _start(workers, nats_url, etcd, namespace, **kwargs) -> StandInWorker:
    worker = await StandInWorker(nats_url, etcd, namespace, "demo", **kwargs).start()
    workers.append(worker)
    return worker


async def _until(condition: Callable[[], object], timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def _unreachable(frontend: RunningFrontend) -> dict[str, str]:
    response = await frontend.http.get("/health")
    assert response.status_code == 200, response.text
    return response.json()["unreachable"]


async def _wait_unreachable(frontend: RunningFrontend, expected: set[str]) -> None:
    async with asyncio.timeout(30):
        while set(await _unreachable(frontend)) != expected:
            await asyncio.sleep(0.02)


async def test_a_lost_instance_gets_no_request_until_it_answers_a_ping(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    mute = await _start(workers, nats_url, etcd, namespace, behaviour=Behaviour.MUTE)
    live = await _start(workers, nats_url, etcd, namespace)
    await _until(lambda: len(getattr(frontend.registry.get("demo"), "instances", ())) == 2)
    while not mute.unanswered:  # by load, then fewest sent: the first or second goes to it
        assert (await frontend.http.post(CHAT, json=BODY)).status_code == 200
    await _wait_unreachable(frontend, {f"{mute.instance_id:x}"})
    reason = (await _unreachable(frontend))[f"{mute.instance_id:x}"]
    assert "stopped answering" in reason
    metrics = (await frontend.http.get("/metrics")).text
    assert "lorafleet_frontend_unreachable_instances 1.0" in metrics

    results = [await frontend.http.post(CHAT, json=BODY) for _ in range(8)]

    assert [r.status_code for r in results] == [200] * 8
    assert len(mute.unanswered) == 1, "the lost instance got requests before answering a ping"
    await mute.unmute()
    await _wait_unreachable(frontend, set())
    served_before = len(live.generated)
    results = [await frontend.http.post(CHAT, json=BODY) for _ in range(4)]
    assert [r.status_code for r in results] == [200] * 4
    assert mute.generated, "the instance that answered its ping got no request again"
    assert len(live.generated) < served_before + 4


async def test_a_model_whose_one_instance_stalled_fails_at_once_saying_why(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    """The first request waits a stall and a ping to learn the instance is lost; the next
    ones are not sent to it at all while it does not answer pings, and say why."""
    mute = await _start(workers, nats_url, etcd, namespace, behaviour=Behaviour.MUTE)
    await _until(lambda: frontend.registry.get("demo") is not None)
    first = await frontend.http.post(CHAT, json=BODY)
    assert first.status_code == 503
    assert "stopped answering" in first.json()["error"]["message"]
    key = f"{mute.instance_id:x}"
    async with asyncio.timeout(30):  # a probe's ping went unanswered too: not a busy moment
        while "pings unanswered" not in (await _unreachable(frontend)).get(key, ""):
            await asyncio.sleep(0.02)

    second = await frontend.http.post(CHAT, json=BODY)

    assert second.status_code == 503
    message = second.json()["error"]["message"]
    assert f"{mute.instance_id:x}" in message and "unreachable from this frontend" in message
    assert len(mute.unanswered) == 1
    await mute.unmute()
    await _wait_unreachable(frontend, set())
    assert (await frontend.http.post(CHAT, json=BODY)).status_code == 200


async def test_no_responder_is_named_in_the_503(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    """A worker whose records outlive it (or whose NATS route is cut): 503 says why."""
    gone = await _start(workers, nats_url, etcd, namespace)
    await _until(lambda: frontend.registry.get("demo") is not None)
    await gone.stop(retract=False)

    response = await frontend.http.post(CHAT, json=BODY)

    assert response.status_code == 503
    assert "no responder on its subject" in response.json()["error"]["message"]


async def test_requests_in_flight_on_an_instance_found_gone_move_on_at_once(
    etcd_url, nats_url, namespace, workers, etcd
) -> None:
    """A request that finds no responder for an instance wakes those waiting on it: they
    ping it now and go elsewhere, instead of each waiting out its own stall (60 s here)."""
    config = FrontendConfig(
        namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url), nats_server=nats_url,
        dispatch=LONG_STALL,
    )  # fmt: skip
    async with run_frontend(config) as frontend:
        slow = await _start(
            workers, nats_url, etcd, namespace, adapters=("pirate",), token_delay_s=0.2
        )
        await _start(workers, nats_url, etcd, namespace)
        await _until(lambda: len(getattr(frontend.registry.get("demo"), "instances", ())) == 2)
        await _until(lambda: frontend.registry.get("pirate") is not None)
        long = {**BODY, "max_tokens": 40}
        in_flight = [asyncio.create_task(frontend.http.post(CHAT, json=long)) for _ in range(2)]
        await _until(lambda: slow.generated)  # fewest in flight: one of the two runs there
        await slow.cut_from_nats()  # gone from NATS (a cut route); its records stay in etcd

        gone = await frontend.http.post(CHAT, json={**BODY, "model": "pirate"})

        assert gone.status_code == 503
        assert "no responder on its subject" in gone.json()["error"]["message"]
        results = await asyncio.gather(*in_flight)  # the client gives up after 10 s
        assert [r.status_code for r in results] == [200, 200]
