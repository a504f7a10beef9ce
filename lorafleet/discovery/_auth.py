"""Put the current etcd auth token on every gRPC call, authenticating again when it is lost.

etcd's simple tokens die when etcd restarts or after ``--auth-token-ttl`` idle; aetcd
fetches one token at connect and never renews it. This interceptor owns the token: the
client ``forget()``s it when etcd calls it invalid, and the next call authenticates anew.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any, TypeAlias

import grpc
from aetcd import rpc

__all__ = ["TokenInterceptor", "is_stale_token"]

_AUTHENTICATE_METHOD = "/etcdserverpb.Auth/Authenticate"
_STALE_TOKEN = "invalid auth token"


def is_stale_token(exc: BaseException) -> bool:
    """Whether etcd refused a call only because it no longer knows the token."""
    details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    return _STALE_TOKEN in (details or "")


Continuation: TypeAlias = Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]]
"""gRPC's next step for a call: ``continuation(details, request)`` starts it."""


class TokenInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds ``("token", ...)`` metadata to each call; one authentication at a time.

    Install ``interceptors()``, not this object alone: grpc.aio files each interceptor
    under the first call kind it is (an if/elif), so one object of all four kinds saw only
    unary calls, and a watch went without its token; with etcd auth on, etcd cancelled
    every watch (permission denied) and a frontend never saw a worker that started after it.
    """

    def __init__(self, username: str, password: str, timeout_s: float) -> None:
        self._username = username
        self._password = password
        self._timeout_s = timeout_s
        self._token: str | None = None
        self._lock = asyncio.Lock()
        self._stub: Any = None

    def bind(self, channel: grpc.aio.Channel) -> None:
        """Authenticate over ``channel``, the one this interceptor is installed on."""
        self._stub = rpc.AuthStub(channel)
        self._token = None

    def forget(self) -> None:
        """Drop the token etcd no longer accepts; the next call authenticates again."""
        self._token = None

    async def token(self) -> str:
        """The current token, authenticating first if there is none."""
        async with self._lock:
            if self._token is None:
                request = rpc.AuthenticateRequest(name=self._username, password=self._password)
                reply = await self._stub.Authenticate(request, timeout=self._timeout_s)
                self._token = reply.token
            return self._token

    def interceptors(self) -> list[grpc.aio.ClientInterceptor]:
        """This interceptor and one per streaming call kind, all sharing its token."""
        return [self, _UnaryStreamTokens(self), _StreamUnaryTokens(self), _StreamStreamTokens(self)]

    async def with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        """``details`` with the current token in its metadata (Authenticate itself goes bare)."""
        if details.method in (_AUTHENTICATE_METHOD, _AUTHENTICATE_METHOD.encode()):
            return details
        metadata = grpc.aio.Metadata(*(details.metadata or ()), ("token", await self.token()))
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials,
            details.wait_for_ready,
        )  # fmt: skip

    async def intercept_unary_unary(
        self, continuation: Continuation, client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:  # fmt: skip
        """Send the call with the token; once more with a new token if etcd forgot the old one.

        etcd forgets every simple token when it restarts, yet keep-alives need none: a
        lease kept alive across a restart met the stale token first on its next put.
        """
        call = await continuation(await self.with_token(client_call_details), request)
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAUTHENTICATED or not is_stale_token(exc):
                raise
        self.forget()
        return await continuation(await self.with_token(client_call_details), request)


class _UnaryStreamTokens(grpc.aio.UnaryStreamClientInterceptor):
    """The token on unary-stream calls."""

    def __init__(self, tokens: TokenInterceptor) -> None:
        self._tokens = tokens

    async def intercept_unary_stream(
        self, continuation: Continuation, client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:  # fmt: skip
        return await continuation(await self._tokens.with_token(client_call_details), request)


class _StreamUnaryTokens(grpc.aio.StreamUnaryClientInterceptor):
    """The token on stream-unary calls."""

    def __init__(self, tokens: TokenInterceptor) -> None:
        self._tokens = tokens

    async def intercept_stream_unary(
        self, continuation: Continuation, client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: AsyncIterable[Any] | Iterable[Any],
    ) -> Any:  # fmt: skip
        details = await self._tokens.with_token(client_call_details)
        return await continuation(details, request_iterator)


class _StreamStreamTokens(grpc.aio.StreamStreamClientInterceptor):
    """The token on stream-stream calls: etcd checks it when a watch is created."""

    def __init__(self, tokens: TokenInterceptor) -> None:
        self._tokens = tokens

    async def intercept_stream_stream(
        self, continuation: Continuation, client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: AsyncIterable[Any] | Iterable[Any],
    ) -> Any:  # fmt: skip
        details = await self._tokens.with_token(client_call_details)
        return await continuation(details, request_iterator)
