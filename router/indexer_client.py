"""The router's connection to the indexer: one gRPC channel per address and the calls the router makes.

Every call carries a deadline and fails fast instead of queueing while a channel is down
(`wait_for_ready=False`); the channel reconnects by itself in the background, so the router
recovers as soon as an indexer answers again. A call that finds its indexer unreachable or too slow
is tried once more on the next address, and later calls start from that address. A `dns:///HOST:PORT`
address is one channel over every address the name resolves to, balanced round-robin (several
indexer replicas behind one service name); a call that fails over is retried on that same channel,
which picks another replica. gRPC status codes become router errors here and nowhere else.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.errors import (
    IndexerFailed,
    IndexerUnavailable,
    InvalidRequest,
    RouterError,
    SessionNotFound,
    ToolNotFound,
    TooManySessions,
)
from toolsearch.transport import ChannelSecurity, aio_channel
from toolsearch.v1 import indexer_pb2 as pb
from toolsearch.v1 import indexer_pb2_grpc

__all__ = ["IndexerClient", "Principal"]

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
_FAILOVER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_ERROR_KEY = "toolsearch-error"
UNAVAILABLE_MESSAGE = "indexer unavailable, retry shortly"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: an issuer and a subject. Both empty means anonymous."""

    issuer: str = ""
    subject: str = ""

    def to_proto(self) -> pb.Principal:
        return pb.Principal(issuer=self.issuer, subject=self.subject)


def _error_kind(exc: grpc.aio.AioRpcError) -> str:
    for key, value in exc.trailing_metadata() or ():
        if key == _ERROR_KEY:
            return str(value)
    return ""


def translate(exc: grpc.aio.AioRpcError, tool_name: str = "") -> RouterError:
    """The router error for a failed indexer call; `tool_name` names the tool a ResolveTool asked for."""
    code = exc.code()
    details = exc.details() or code.name
    if code in _FAILOVER or code == grpc.StatusCode.CANCELLED:
        return IndexerUnavailable(UNAVAILABLE_MESSAGE)
    if code == grpc.StatusCode.NOT_FOUND:
        if _error_kind(exc) == "tool-not-found":
            return ToolNotFound(tool_name)
        return SessionNotFound("session not found: re-initialize")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return TooManySessions(details)
    return IndexerFailed(f"indexer error ({code.name})")


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
        self._stubs = [indexer_pb2_grpc.IndexerStub(c) for c in self._channels]
        self._health = [health_pb2_grpc.HealthStub(channel) for channel in self._channels]
        self._current = 0  # the address calls start from; moves on after a failover
        # a balanced channel counts twice: its retry goes to another of the replicas behind it
        self._tries = min(2, len(self.addresses) + sum(a.startswith("dns:") for a in self.addresses))

    async def close(self) -> None:
        """Close every channel; calls in flight are cancelled."""
        await asyncio.gather(*(channel.close() for channel in self._channels))

    async def _call(
        self, method: str, request: Any, tool_name: str = "", timeout: float | None = None
    ) -> Any:
        tries = self._tries
        start = self._current
        metadata = self._security.metadata or None
        for attempt in range(tries):
            index = (start + attempt) % len(self._stubs)
            rpc = getattr(self._stubs[index], method)
            try:
                return await rpc(
                    request, timeout=timeout or self.timeout, wait_for_ready=False, metadata=metadata
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    # a deployment fault, not the caller's: say which settings to check
                    logger.error(
                        "indexer %s refused this router's credentials: check router.indexer_secret_env "
                        "and router.indexer_tls",
                        self.addresses[index],
                    )
                if exc.code() in _FAILOVER:
                    logger.warning("indexer %s: %s %s", self.addresses[index], method, exc.code().name)
                    if attempt + 1 < tries:
                        self._current = (index + 1) % len(self._stubs)
                        continue
                raise translate(exc, tool_name) from None
        raise IndexerUnavailable(UNAVAILABLE_MESSAGE)  # pragma: no cover - the loop always returns or raises

    async def open_session(
        self, principal: Principal, bearer_token: str | None, *, implied: bool = False
    ) -> pb.OpenSessionResponse:
        """Open a session for `principal`; with `implied`, its implied session (created on first use)."""
        request = pb.OpenSessionRequest(
            principal=principal.to_proto(),
            credentials=pb.Credentials(bearer_token=bearer_token or ""),
            implied=implied,
        )
        response: pb.OpenSessionResponse = await self._call(
            "OpenSession", request, timeout=self.open_session_timeout
        )
        return response

    async def get_session(self, session_id: str, principal: Principal) -> pb.GetSessionResponse:
        """Check that a session exists and belongs to `principal`; raises `SessionNotFound`."""
        request = pb.GetSessionRequest(session_id=session_id, principal=principal.to_proto())
        response: pb.GetSessionResponse = await self._call("GetSession", request)
        return response

    async def close_session(self, session_id: str, principal: Principal) -> None:
        """End a session; raises `SessionNotFound` when it is unknown or foreign."""
        request = pb.CloseSessionRequest(session_id=session_id, principal=principal.to_proto())
        await self._call("CloseSession", request)

    async def find_tools(
        self, session_id: str, principal: Principal, query: str, keywords: Sequence[str], limit: int
    ) -> pb.FindToolsResponse:
        """Search the session's current index version; `limit` 0 means the indexer's default."""
        request = pb.FindToolsRequest(
            session_id=session_id,
            principal=principal.to_proto(),
            query=query,
            keywords=keywords,
            limit=limit,
        )
        response: pb.FindToolsResponse = await self._call("FindTools", request)
        return response

    async def resolve_tool(self, session_id: str, principal: Principal, name: str) -> pb.ResolveToolResponse:
        """Resolve an advertised tool name to its backend; raises `ToolNotFound`."""
        request = pb.ResolveToolRequest(session_id=session_id, principal=principal.to_proto(), name=name)
        response: pb.ResolveToolResponse = await self._call("ResolveTool", request, tool_name=name)
        return response

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
