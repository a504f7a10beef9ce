"""``UvicornServer`` over a real port: a signal ends it with no re-raise, or is left alone."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import uvicorn

from lorafleet.launch.local_servers import free_port
from lorafleet.process.uvicorn_server import UvicornServer


async def _app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _serving(server: UvicornServer) -> asyncio.Task[None]:
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "the server stopped during start-up"
        await asyncio.sleep(0.01)
    return task


def _config(port: int) -> uvicorn.Config:
    return uvicorn.Config(_app, host="127.0.0.1", port=port, log_config=None, lifespan="off")


async def test_sigterm_calls_on_signal_and_ends_serving_without_killing_the_process() -> None:
    port = free_port()
    signalled = asyncio.Event()
    server = UvicornServer(_config(port), on_signal=signalled.set)
    task = await _serving(server)
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"http://127.0.0.1:{port}/")).text == "ok"
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's own handler would re-raise it: death
    await asyncio.wait_for(task, timeout=30)
    assert signalled.is_set()


async def test_without_on_signal_the_owner_s_signal_handlers_stay() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = UvicornServer(_config(free_port()))
    task = await _serving(server)
    assert {sig: signal.getsignal(sig) for sig in before} == before
    server.should_exit = True  # what the owner does on its signal
    await asyncio.wait_for(task, timeout=30)
