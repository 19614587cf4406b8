"""The router's indexer calls through an indexer that goes away: what is tried again, and where.

The router's `IndexerClient` runs in the test's loop against small gRPC servers standing in for
indexer replicas (a servicer that counts its calls and answers after a short pause), on loopback
ports. Stopping one of them while calls pour in is what a replica restart does to the router; the
callers must see no error. Waits are on conditions with bounded timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc
import pytest

from commands.ports import free_port
from router.errors import RouterError, SessionNotFound
from router.link.failover import Failure, failure_of, next_address
from router.link.indexer_client import IndexerClient
from tests.support.waits import wait_for
from toolsearch.sessions import Principal
from toolsearch.v1 import indexer_pb2 as pb
from toolsearch.v1 import indexer_pb2_grpc as pb_grpc

WAIT = 15.0  # seconds any condition may take at most
CALLERS = 32
ALICE = Principal("https://issuer.test", "alice")


def _error(code: grpc.StatusCode, details: str = "", kind: str = "") -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata(("toolsearch-error", kind)) if kind else grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details)


NO_CONNECTION = "failed to connect to all addresses; last error: UNKNOWN: Connection refused"


@pytest.mark.parametrize(
    ("error", "idempotent", "expected"),
    [
        # dropped by a stopping server before any handler took it: never ran, so any call goes on
        (_error(grpc.StatusCode.CANCELLED, "CANCELLED"), False, Failure(retry=True, ran=False)),
        (_error(grpc.StatusCode.UNAVAILABLE, NO_CONNECTION), False, Failure(retry=True, ran=False)),
        (_error(grpc.StatusCode.UNAVAILABLE, "loading", "not-ready"), False, Failure(retry=True, ran=False)),
        # may have run: only what is harmless twice goes on
        (_error(grpc.StatusCode.UNAVAILABLE, "Socket closed"), True, Failure(retry=True, ran=True)),
        (_error(grpc.StatusCode.UNAVAILABLE, "Socket closed"), False, Failure(retry=False, ran=True)),
        (_error(grpc.StatusCode.UNAVAILABLE, "Redis", "state-unavailable"), False, Failure(False, True)),
        (_error(grpc.StatusCode.DEADLINE_EXCEEDED), True, Failure(retry=True, ran=True)),
        (_error(grpc.StatusCode.DEADLINE_EXCEEDED), False, Failure(retry=False, ran=True)),
        # the indexer's own answers are not failures of the link
        (_error(grpc.StatusCode.NOT_FOUND, "gone", "session-not-found"), True, None),
        (_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", "sessions-full"), True, None),
    ],
)
def test_a_failed_call_is_tried_again_only_where_that_is_safe(
    error: grpc.aio.AioRpcError, idempotent: bool, expected: Failure | None
) -> None:
    assert failure_of(error, idempotent) == expected


def test_the_next_address_is_an_untried_live_one_then_a_live_one_again() -> None:
    assert next_address(0, [False, False], set()) == 0
    assert next_address(0, [False, False], {0}) == 1
    assert next_address(1, [False, True, False], {1}) == 2  # round the list, past the dead one
    assert next_address(0, [False, True], {0}) == 1  # untried, even if its connection is down
    assert next_address(0, [False, True], {0, 1}) == 0  # then the live one again, not the dead one
    assert next_address(0, [False], {0}) == 0  # one balanced channel: its retry picks another replica


class FakeIndexer(pb_grpc.IndexerServicer):
    """Answers the calls the router makes, after `pause` seconds (`slow` of them after `slow_pause`)."""

    def __init__(self, pause: float = 0.01) -> None:
        self.pause = pause
        self.slow = 0
        self.slow_pause = 0.0
        self.calls: Counter[str] = Counter()
        self.proposed: list[str] = []  # the session id each OpenSession proposed
        self.cancel = 0  # calls to answer CANCELLED, as a stopping server does to calls it dropped
        self.gone = False  # CloseSession answers that the session is not found

    async def _answer(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self.calls[method] += 1
        if self.cancel:
            self.cancel -= 1
            await context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")
        pause = self.pause
        if self.slow:
            self.slow -= 1
            pause = self.slow_pause
        await asyncio.sleep(pause)

    async def OpenSession(
        self, request: pb.OpenSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.OpenSessionResponse:
        self.proposed.append(request.session_id)
        await self._answer("OpenSession", context)
        return pb.OpenSessionResponse(session_id=request.session_id or "s" * 32)

    async def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSessionResponse:
        await self._answer("GetSession", context)
        return pb.GetSessionResponse(session_id=request.session_id)

    async def FindTools(
        self, request: pb.FindToolsRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindToolsResponse:
        await self._answer("FindTools", context)
        return pb.FindToolsResponse()

    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CloseSessionResponse:
        await self._answer("CloseSession", context)
        if self.gone:
            context.set_trailing_metadata((("toolsearch-error", "session-not-found"),))
            await context.abort(grpc.StatusCode.NOT_FOUND, "session not found")
        return pb.CloseSessionResponse()

    @property
    def answered(self) -> int:
        return sum(self.calls.values())


def more_answers(servicer: FakeIndexer, count: int) -> Callable[[], bool]:
    """Whether `servicer` has answered `count` more calls than it has now."""
    target = servicer.answered + count
    return lambda: servicer.answered >= target


@dataclass
class Replica:
    """One fake indexer on a fixed port, which can be stopped and started again."""

    port: int = field(default_factory=free_port)
    servicer: FakeIndexer = field(default_factory=FakeIndexer)
    server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_IndexerServicer_to_server(self.servicer, self.server)
        self.server.add_insecure_port(self.address)
        await self.server.start()

    async def stop(self, grace: float | None = 3.0) -> None:
        """What SIGTERM does to an indexer: no new calls, those in flight get `grace` seconds."""
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None


@contextlib.asynccontextmanager
async def replicas(count: int, timeout: float = 5.0) -> AsyncIterator[tuple[list[Replica], IndexerClient]]:
    started = [Replica() for _ in range(count)]
    for replica in started:
        await replica.start()
    client = IndexerClient([r.address for r in started], timeout=timeout)
    try:
        yield started, client
    finally:
        await client.close()
        for replica in started:
            await replica.stop(None)


@dataclass
class Load:
    """Callers that loop over the router's calls, counting what they would have shown a user."""

    client: IndexerClient
    answered: int = 0
    errors: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def caller(self, number: int) -> None:
        calls = (
            lambda: self.client.get_session("s" * 32, ALICE),
            lambda: self.client.find_tools("s" * 32, ALICE, "weather", [], 3),
            lambda: self.client.open_session(ALICE, None),
            lambda: self.client.open_session(ALICE, None, implied=True),
            lambda: self.client.close_session("s" * 32, ALICE),
        )
        step = number
        while not self.stop.is_set():
            step += 1
            try:
                await calls[step % len(calls)]()
            except RouterError as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.05)
            else:
                self.answered += 1

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(self.caller(n)) for n in range(CALLERS)]
        try:
            yield
        finally:
            self.stop.set()
            await asyncio.gather(*tasks)


async def test_calls_to_an_indexer_that_stops_and_starts_again_are_answered_by_the_other() -> None:
    async with replicas(2) as (both, client):
        load = Load(client)
        async with load.running():
            # each replica in turn stops under load (its calls in flight finish, new ones are
            # refused or dropped) and starts again, while the other answers
            for stopping in (0, 1, 0, 1):
                serving = both[stopping].servicer
                await wait_for(more_answers(serving, CALLERS), WAIT)
                await both[stopping].stop()
                await wait_for(more_answers(both[1 - stopping].servicer, 2 * CALLERS), WAIT)
                await both[stopping].start()
        assert load.errors == [], load.errors[:5]
        assert load.answered > 8 * CALLERS


async def test_a_call_a_stopping_indexer_dropped_is_answered_by_the_other_even_an_open() -> None:
    async with replicas(2) as ((first, second), client):
        first.servicer.cancel = 1
        opened = await client.open_session(ALICE, None)
        assert opened.session_id and first.servicer.calls["OpenSession"] == 1
        assert second.servicer.calls["OpenSession"] == 1


async def test_an_open_that_timed_out_is_tried_on_the_other_under_the_same_proposed_id() -> None:
    async with replicas(2, timeout=0.5) as ((first, second), client):
        first.servicer.slow, first.servicer.slow_pause = 1, 2.0
        opened = await client.open_session(ALICE, None)  # it may have run: the same id makes it harmless
        assert (first.servicer.calls["OpenSession"], second.servicer.calls["OpenSession"]) == (1, 1)
        assert first.servicer.proposed == second.servicer.proposed == [opened.session_id]
        assert len(opened.session_id) >= 22  # 128 random bits at least
        second.servicer.slow, second.servicer.slow_pause = 1, 2.0  # calls start from the one that answered
        await client.find_tools("s" * 32, ALICE, "weather", [], 3)  # harmless twice: tried on the other
        assert (first.servicer.calls["FindTools"], second.servicer.calls["FindTools"]) == (1, 1)


async def test_each_open_proposes_an_id_of_its_own_and_an_implied_one_none() -> None:
    async with replicas(1) as ((only,), client):
        first = await client.open_session(ALICE, None)
        second = await client.open_session(ALICE, None)
        await client.open_session(ALICE, None, implied=True)
        assert first.session_id != second.session_id
        assert only.servicer.proposed == [first.session_id, second.session_id, ""]


async def test_a_dead_indexers_refusal_does_not_use_up_the_retry_a_timed_out_call_is_owed() -> None:
    async with replicas(2, timeout=0.5) as ((live, dead), client):
        await dead.stop(None)
        live.servicer.slow, live.servicer.slow_pause = 1, 2.0  # the first call times out, the next is quick
        await client.find_tools("s" * 32, ALICE, "weather", [], 3)
        assert live.servicer.calls["FindTools"] == 2


async def test_a_close_that_may_have_run_is_done_when_the_other_finds_the_session_gone() -> None:
    async with replicas(2, timeout=0.5) as ((first, second), client):
        first.servicer.slow, first.servicer.slow_pause = 1, 2.0  # it ends the session, its answer lost
        second.servicer.gone = True
        await client.close_session("s" * 32, ALICE)
        assert (first.servicer.calls["CloseSession"], second.servicer.calls["CloseSession"]) == (1, 1)
        first.servicer.gone = True
        with pytest.raises(SessionNotFound):  # answered at once, by the first: the session is unknown
            await client.close_session("s" * 32, ALICE)
