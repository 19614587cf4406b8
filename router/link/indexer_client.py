"""The router's connection to the indexer: one gRPC channel per address and the calls the router makes.

Every call carries a deadline and fails fast instead of queueing while a channel is down
(`wait_for_ready=False`); the channel reconnects by itself in the background, so the router
recovers as soon as an indexer answers again. A call that finds its indexer gone or too slow is tried
on the next address when that is safe (router/link/failover.py says when), addresses whose connection is
down last, and later calls start from the address that answered. A `dns:///HOST:PORT` address is one
channel over every address the name resolves to, balanced round-robin (several indexer replicas
behind one service name); a call that fails over is retried on that same channel, which picks
another replica. gRPC status codes become router errors in router/link/indexer_errors.py; the
answers become the router's values in router/link/indexer_answers.py and backend_targets.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.caller import Principal
from router.errors import IndexerUnavailable
from router.found import Found
from router.link.backend_targets import (
    SessionAnswer,
    reachable_targets,
    resolved_tool,
    session_answer,
    session_targets,
    stored_session,
)
from router.link.failover import error_kind, judge, next_address
from router.link.indexer_answers import found, pinned_definitions, status_view
from router.link.indexer_errors import UNAVAILABLE_MESSAGE, translate
from router.targets import BackendSession, BackendTarget, ReachableTargets, ResolvedTool
from toolsearch.trailers import ErrorKind
from toolsearch.transport import ChannelSecurity, aio_channel
from toolsearch.v1 import indexer_pb2 as pb
from toolsearch.v1 import indexer_pb2_grpc

if TYPE_CHECKING:
    from toolsearch.v1.indexer_pb2_grpc import IndexerAsyncStub  # declared for type checkers only

logger = logging.getLogger(__name__)

# A fast reconnect after an indexer restart matters more than sparing a dead address a few dials.
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
# Spreads calls over every resolved address; the default (pick_first) would use one replica only.
_ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})

_Request = TypeVar("_Request", bound=Message)
_Response = TypeVar("_Response", bound=Message)
_Request_contra = TypeVar("_Request_contra", bound=Message, contravariant=True)
_Response_co = TypeVar("_Response_co", bound=Message, covariant=True)


class _Unary(Protocol[_Request_contra, _Response_co]):
    """A unary-unary method of an asyncio stub, as the router calls it; grpc ships no types of its own."""

    def __call__(
        self,
        request: _Request_contra,
        *,
        timeout: float,
        wait_for_ready: bool,
        metadata: Sequence[tuple[str, str]] | None,
    ) -> Awaitable[_Response_co]: ...


def _principal(principal: Principal) -> pb.Principal:
    return pb.Principal(issuer=principal.issuer, subject=principal.subject)


def channel_options(address: str) -> list[tuple[str, Any]]:
    """The channel options for one indexer address: round-robin balancing for a `dns:` target."""
    if address.startswith("dns:"):
        return [*_CHANNEL_OPTIONS, ("grpc.service_config", _ROUND_ROBIN)]
    return list(_CHANNEL_OPTIONS)


class IndexerClient:
    """The calls the router makes to the indexer, over one channel per indexer address.

    Create it inside the event loop that uses it (the application's lifespan) and `close` it there.
    `interceptors` see every call on every channel (the router's metrics use one); `security` is
    the link's protection (TLS credentials, the shared secret every call carries). OpenSession gets
    `open_session_timeout` (it may list backends and build an index version), other calls `timeout`.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        timeout: float,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        security: ChannelSecurity | None = None,
        open_session_timeout: float | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("IndexerClient needs at least one indexer address")
        self.addresses = list(addresses)
        self.timeout = timeout
        self.open_session_timeout = open_session_timeout or timeout
        self._security = security or ChannelSecurity()
        self._channels = [
            aio_channel(a, self._security, channel_options(a), interceptors) for a in self.addresses
        ]
        # The stub of an asyncio channel is an IndexerAsyncStub; grpc ships no types to tell mypy so.
        self._stubs = [cast("IndexerAsyncStub", indexer_pb2_grpc.IndexerStub(c)) for c in self._channels]
        self._health = [health_pb2_grpc.HealthStub(channel) for channel in self._channels]
        self._current = 0  # the address calls start from: the last one that answered
        # indexers a call may run on; a balanced channel counts twice: its retry goes to another replica
        self._tries = min(2, len(self.addresses) + sum(a.startswith("dns:") for a in self.addresses))

    async def close(self) -> None:
        """Close every channel; calls in flight are cancelled."""
        await asyncio.gather(*(channel.close() for channel in self._channels))

    async def _call(
        self,
        method: Callable[[IndexerAsyncStub], _Unary[_Request, _Response]],
        request: _Request,
        tool_name: str = "",
        timeout: float | None = None,
        idempotent: bool = True,
        backend_id: str = "",
        if_gone: _Response | None = None,
    ) -> _Response:
        """Call `method` with `request`, failing over to other addresses; a failure becomes a router error.

        `method` picks the method off a stub (`lambda stub: stub.FindTools`) rather than being one
        stub's bound method: each address has a stub of its own, and a failover calls another's.
        `idempotent`: whether running the call twice is harmless (router/link/failover.py);
        `tool_name` and `backend_id` are what a ResolveTool or an ExchangeToken asked for, for its error.
        `if_gone`: the answer when the session is not found after an attempt that may have run (a
        close that ran there, its answer lost).
        """
        metadata = self._security.metadata or None
        each = timeout or self.timeout
        # a call costs at most `tries` timeouts, however it fails over
        loop = asyncio.get_running_loop()
        ends = loop.time() + self._tries * each
        ran = 0  # attempts that may have run on an indexer
        tried: set[int] = set()
        # every address once and one of them again (a lone plain address once); then, if every one
        # refused it unrun, the first whose connection is back
        attempts = len(self._stubs) + 1 if self._tries > 1 else 1
        for attempt in range(attempts + 1):
            left = ends - loop.time()
            if attempt < attempts:
                down = [c.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE for c in self._channels]
                index = next_address(self._current, down, tried)
            elif self._tries > 1 and left > 0 and (ready := await self._first_ready(left)) is not None:
                # none connected (say, each replica restarted in turn, and their connections wait out
                # a reconnect backoff): the first back gets the call
                index = ready
            else:
                break
            tried.add(index)
            rpc = method(self._stubs[index])
            try:
                response = await rpc(
                    request,
                    timeout=min(each, max(ends - loop.time(), 0.001)),
                    wait_for_ready=False,
                    metadata=metadata,
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    # a deployment fault, not the caller's: say which settings to check
                    logger.error(
                        "indexer %s refused this router's credentials: check router.indexer_secret_env "
                        "and router.indexer_tls",
                        self.addresses[index],
                    )
                failure = judge(exc, idempotent)
                if failure is None:
                    if ran and if_gone is not None and error_kind(exc) == ErrorKind.SESSION_NOT_FOUND:
                        return if_gone
                    raise translate(exc, tool_name, backend_id) from None
                # each request message is named for its method: OpenSessionRequest, ...
                name = request.DESCRIPTOR.name.removesuffix("Request")
                logger.warning(
                    "indexer %s: %s %s (%s)", self.addresses[index], name, exc.code().name, exc.details()
                )
                ran += failure.ran
                if not failure.retry or ran >= self._tries:
                    raise translate(exc, tool_name, backend_id) from None
                continue
            self._current = index
            return response
        raise IndexerUnavailable(UNAVAILABLE_MESSAGE)  # no indexer took the call

    async def _first_ready(self, within: float) -> int | None:
        """The first address whose connection is up within `within` seconds, if any."""
        waits = {
            asyncio.ensure_future(channel.channel_ready()): i for i, channel in enumerate(self._channels)
        }
        try:
            done, _ = await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        ready = [waits[task] for task in done if not task.cancelled() and task.exception() is None]
        return min(ready) if ready else None

    async def open_session(
        self,
        principal: Principal,
        bearer_token: str | None,
        *,
        implied: bool = False,
        resolve: str = "",
        capabilities_json: str = "",
    ) -> SessionAnswer:
        """Open a session for `principal`; with `implied`, its implied session (created on first use).

        With `resolve`, the answer carries that tool's resolution too, when the name resolves;
        `capabilities_json` is what the client declared at initialize, kept with the session.
        """
        request = pb.OpenSessionRequest(
            principal=_principal(principal),
            credentials=pb.Credentials(bearer_token=bearer_token or ""),
            implied=implied,
            resolve=resolve,
            # the id every attempt proposes: one that may have run has opened this very session,
            # which a second attempt then answers, so the open is harmless twice
            session_id="" if implied else secrets.token_urlsafe(24),
            client_capabilities_json=capabilities_json,
        )
        opened: pb.OpenSessionResponse = await self._call(
            lambda stub: stub.OpenSession, request, timeout=self.open_session_timeout
        )
        return session_answer(opened)

    async def get_session(self, session_id: str, principal: Principal, resolve: str = "") -> SessionAnswer:
        """Check that a session exists and belongs to `principal`; raises `SessionNotFound`.

        With `resolve`, the answer carries that tool's resolution too, when the name resolves.
        """
        principal_message = _principal(principal)
        request = pb.GetSessionRequest(session_id=session_id, principal=principal_message, resolve=resolve)
        checked: pb.GetSessionResponse = await self._call(lambda stub: stub.GetSession, request)
        return session_answer(checked)

    async def close_session(
        self, session_id: str, principal: Principal, bearer_token: str | None = None
    ) -> None:
        """End a session (its backend sessions too, at passthrough ones with `bearer_token`).

        Raises `SessionNotFound` when it is unknown or foreign.
        """
        request = pb.CloseSessionRequest(
            session_id=session_id,
            principal=_principal(principal),
            credentials=pb.Credentials(bearer_token=bearer_token or ""),
        )
        await self._call(lambda stub: stub.CloseSession, request, if_gone=pb.CloseSessionResponse())

    async def set_backend_session(
        self,
        session_id: str,
        principal: Principal,
        backend_id: str,
        previous: str,
        backend_session: BackendSession,
    ) -> BackendSession:
        """Keep a backend session with the client session, unless another replica's came first.

        Returns the one the session keeps now: `backend_session`, or the one that won.
        """
        request = pb.SetBackendSessionRequest(
            session_id=session_id,
            principal=_principal(principal),
            backend_id=backend_id,
            previous=previous,
            backend_session=stored_session(backend_session),
        )
        response: pb.SetBackendSessionResponse = await self._call(
            lambda stub: stub.SetBackendSession, request
        )
        return BackendSession(response.stored.session_id, response.stored.protocol_version)

    async def backend_sessions(self, session_id: str, principal: Principal) -> list[BackendTarget]:
        """The backends the session has a backend session at, each with it; raises `SessionNotFound`."""
        request = pb.BackendSessionsRequest(session_id=session_id, principal=_principal(principal))
        response: pb.BackendSessionsResponse = await self._call(lambda stub: stub.BackendSessions, request)
        return session_targets(response)

    async def set_log_level(self, session_id: str, principal: Principal, level: str) -> list[BackendTarget]:
        """Keep the log level the session's client set; the backend sessions to pass it on to.

        Raises `SessionNotFound`, or `InvalidRequest` for a level that is not MCP's.
        """
        request = pb.SetLogLevelRequest(session_id=session_id, principal=_principal(principal), level=level)
        response: pb.SetLogLevelResponse = await self._call(lambda stub: stub.SetLogLevel, request)
        return session_targets(response)

    async def reachable_backends(self, session_id: str, principal: Principal) -> ReachableTargets:
        """The session's advertised backends that offer resources, prompts or completions."""
        request = pb.ReachableBackendsRequest(session_id=session_id, principal=_principal(principal))
        response: pb.ReachableBackendsResponse = await self._call(
            lambda stub: stub.ReachableBackends, request
        )
        return reachable_targets(response)

    async def find_tools(
        self,
        session_id: str,
        principal: Principal,
        query: str,
        keywords: Sequence[str],
        limit: int,
        compact: bool = False,
    ) -> Found:
        """Search the session's current index version; `limit` 0 means the indexer's default."""
        request = pb.FindToolsRequest(
            session_id=session_id,
            principal=_principal(principal),
            query=query,
            keywords=keywords,
            limit=limit,
            compact=compact,
        )
        return found(await self._call(lambda stub: stub.FindTools, request))

    async def pinned_tools(self, session_id: str, principal: Principal, patterns: Sequence[str]) -> list[str]:
        """The MCP definitions (JSON) of the session's tools that match the operator's pinned patterns."""
        request = pb.PinnedToolsRequest(
            session_id=session_id, principal=_principal(principal), patterns=patterns
        )
        return pinned_definitions(await self._call(lambda stub: stub.PinnedTools, request))

    async def resolve_tool(self, session_id: str, principal: Principal, name: str) -> ResolvedTool:
        """Resolve an advertised tool name to its backend; raises `ToolNotFound`."""
        request = pb.ResolveToolRequest(session_id=session_id, principal=_principal(principal), name=name)
        response: pb.ResolveToolResponse = await self._call(
            lambda stub: stub.ResolveTool, request, tool_name=name
        )
        return resolved_tool(response)

    async def exchange_token(
        self, principal: Principal, bearer_token: str, backend_id: str, renew: bool = False
    ) -> str:
        """A token for a token_exchange backend, in exchange for the caller's; never logged.

        The indexer exchanges it at the backend's token endpoint, or hands back the one it keeps for
        the principal. Raises `ExchangeFailed` or `ExchangeRefused`, whose reason the indexer wrote.
        It may call out to the endpoint, as opening a session may list backends: it has that time.
        """
        request = pb.ExchangeTokenRequest(
            principal=_principal(principal),
            credentials=pb.Credentials(bearer_token=bearer_token),
            backend_id=backend_id,
            renew=renew,
        )
        response: pb.ExchangeTokenResponse = await self._call(
            lambda stub: stub.ExchangeToken,
            request,
            timeout=self.open_session_timeout,
            backend_id=backend_id,
        )
        return response.access_token

    async def status(self) -> dict[str, Any]:
        """The indexer's backends, index versions, recent swaps and embedding counters, as plain data."""
        return status_view(await self._call(lambda stub: stub.Status, pb.StatusRequest()))

    async def check_health(self) -> dict[str, str]:
        """Each address's answer to the standard gRPC health check: SERVING, NOT_SERVING, or why not."""

        async def check(address: str, stub: Any) -> tuple[str, str]:
            try:
                response = await stub.Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=self.timeout, wait_for_ready=False
                )
            except grpc.aio.AioRpcError as exc:
                return address, f"unreachable ({exc.code().name})"
            return address, health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

        answers = await asyncio.gather(
            *(check(a, s) for a, s in zip(self.addresses, self._health, strict=True))
        )
        return dict(answers)
