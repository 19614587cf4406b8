"""The channels to the indexer: one gRPC channel per address, and a call that fails over between them.

Every call carries a deadline and fails fast instead of queueing while a channel is down
(`wait_for_ready=False`); the channel reconnects by itself in the background, so the router
recovers as soon as an indexer answers again. A call that finds its indexer gone or too slow is tried
on the next address when that is safe (router/link/failover.py says when), addresses whose connection is
down last, and later calls start from the address that answered. A `dns:///HOST:PORT` address is one
channel over every address the name resolves to, balanced round-robin (several indexer replicas
behind one service name); a call that fails over is retried on that same channel, which picks
another replica. gRPC status codes become router errors in router/link/indexer_errors.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.errors import IndexerUnavailable
from router.link.failover import error_kind, failure_of, next_address
from router.link.indexer_errors import UNAVAILABLE_MESSAGE, translate
from toolsearch.trailers import ErrorKind
from toolsearch.transport import ChannelSecurity, aio_channel
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


def channel_options(address: str) -> list[tuple[str, Any]]:
    """The channel options for one indexer address: round-robin balancing for a `dns:` target."""
    if address.startswith("dns:"):
        return [*_CHANNEL_OPTIONS, ("grpc.service_config", _ROUND_ROBIN)]
    return list(_CHANNEL_OPTIONS)


class IndexerChannels:
    """One channel per indexer address, and calls that fail over between them.

    `interceptors` see every call on every channel (the router's metrics use one); `security` is the
    link's protection (TLS credentials, the shared secret every call carries); a call gets `timeout`
    unless it says otherwise.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        timeout: float,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        security: ChannelSecurity | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("the router needs at least one indexer address (router.indexer)")
        self.addresses = list(addresses)
        self.timeout = timeout
        self._security = security or ChannelSecurity()
        self._channels = [
            aio_channel(a, self._security, channel_options(a), interceptors) for a in self.addresses
        ]
        # The stub of an asyncio channel is an IndexerAsyncStub; grpc ships no types to tell mypy so.
        self._stubs = [cast("IndexerAsyncStub", indexer_pb2_grpc.IndexerStub(c)) for c in self._channels]
        self._health = [health_pb2_grpc.HealthStub(channel) for channel in self._channels]
        self.current = 0  # the address calls start from: the last one that answered
        # indexers a call may run on; a balanced channel counts twice: its retry goes to another replica
        self.tries = min(2, len(self.addresses) + sum(a.startswith("dns:") for a in self.addresses))

    async def close(self) -> None:
        """Close every channel; calls in flight are cancelled."""
        await asyncio.gather(*(channel.close() for channel in self._channels))

    async def call(
        self,
        method: Callable[[IndexerAsyncStub], _Unary[_Request, _Response]],
        request: _Request,
        asked: str = "",
        timeout: float | None = None,
        idempotent: bool = True,
        if_gone: _Response | None = None,
    ) -> _Response:
        """Call `method` with `request`, failing over to other addresses; a failure becomes a router error.

        `method` picks the method off a stub (`lambda stub: stub.FindTools`) rather than being one
        stub's bound method: each address has a stub of its own, and a failover calls another's.
        `idempotent`: whether running the call twice is harmless (router/link/failover.py);
        `asked` is what a ResolveTool or an ExchangeToken asked for (a tool, a backend), for its error.
        `if_gone`: the answer when the session is not found after an attempt that may have run (a
        close that ran there, its answer lost).
        """
        metadata = self._security.metadata or None
        each = timeout or self.timeout
        # a call costs at most `tries` timeouts, however it fails over
        loop = asyncio.get_running_loop()
        ends = loop.time() + self.tries * each
        ran = 0  # attempts that may have run on an indexer
        tried: set[int] = set()
        # every address once and one of them again (a lone plain address once); then, if every one
        # refused it unrun, the first whose connection is back
        attempts = len(self._stubs) + 1 if self.tries > 1 else 1
        for attempt in range(attempts + 1):
            left = ends - loop.time()
            if attempt < attempts:
                down = [c.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE for c in self._channels]
                index = next_address(self.current, down, tried)
            elif self.tries > 1 and left > 0 and (ready := await self._first_ready(left)) is not None:
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
                failure = failure_of(exc, idempotent)
                if failure is None:
                    if ran and if_gone is not None and error_kind(exc) == ErrorKind.SESSION_NOT_FOUND:
                        return if_gone
                    raise translate(exc, asked) from None
                # each request message is named for its method: OpenSessionRequest, ...
                name = request.DESCRIPTOR.name.removesuffix("Request")
                logger.warning(
                    "indexer %s: %s %s (%s)", self.addresses[index], name, exc.code().name, exc.details()
                )
                ran += failure.ran
                if not failure.retry or ran >= self.tries:
                    raise translate(exc, asked) from None
                continue
            self.current = index
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
