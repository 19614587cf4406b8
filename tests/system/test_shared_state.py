"""The Redis state backend against a real redis-server, in process: two stores stand for two replicas.

Each test starts from an empty database. Expiry is driven by setting a key's time to live directly,
so nothing waits for a real session TTL; waits are on conditions with bounded timeouts.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aredis

from indexer.embedder.fake import FakeEmbedder
from indexer.retrieval.embeddings import Embeddings
from indexer.state import (
    BackendHealth,
    EndedSession,
    SessionRecord,
    State,
    StateUnavailable,
    Swap,
    SwapChange,
)
from indexer.state.listings import Listing, listing_digest
from indexer.state.redis import Keys
from indexer.state.redis_connection import TIMEOUT
from indexer.state.redis_lease import RedisLease
from tests.support.clients import until
from tests.support.redis import RedisServer, open_state, running_redis
from toolsearch.sessions import BackendSession, Principal, VersionRef

WAIT = 10.0  # seconds any condition may take at most


async def until_within(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    return await until(check, what, WAIT)


ALICE = Principal("https://issuer.test", "alice")
LISTING = Listing(({"name": "get_forecast", "description": "The weather tomorrow."},), "2025-11-25", 0.1)
KEYS = Keys()


@pytest.fixture
async def replicas(
    redis_server: RedisServer, redis_client: aredis.Redis
) -> AsyncIterator[tuple[State, State]]:
    """Two state backends on the same Redis, as two indexer replicas would open them."""
    first = await open_state(redis_server.url, "fake:test", 64, session_ttl=60.0, lease_ttl=0.5)
    second = await open_state(redis_server.url, "fake:test", 64, session_ttl=60.0, lease_ttl=0.5)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


def record(
    session_id: str = "s-1", implied: bool = False, token: str | None = "secret-token"
) -> SessionRecord:
    created = SessionRecord(
        id=session_id,
        principal=ALICE,
        token=token,
        implied=implied,
        accepted=frozenset({"weather", "nba"}),
        rejected_at_creation=frozenset({"cocktails"}),
        own_listings={"weather": LISTING},
        ref=VersionRef(1, "a" * 32),
        catalog=(("nba", "d" * 24), ("weather", listing_digest(LISTING))),
        listed_epochs={"weather": 3},
    )
    created.swaps.append(Swap(None, VersionRef(1, "a" * 32), "created", 1700000000.25))
    return created


async def test_a_session_record_round_trips_through_another_replica(replicas: tuple[State, State]) -> None:
    first, second = replicas
    original = record()
    assert await first.sessions.create(original) == "s-1"
    loaded = await second.sessions.load("s-1")
    assert loaded is not None
    assert (loaded.principal, loaded.token, loaded.implied) == (ALICE, "secret-token", False)
    assert loaded.accepted == {"weather", "nba"} and loaded.rejected_at_creation == {"cocktails"}
    assert loaded.own_listings["weather"].tools == LISTING.tools
    assert (loaded.ref, loaded.catalog, loaded.listed_epochs) == (
        original.ref,
        original.catalog,
        {"weather": 3},
    )
    assert list(loaded.swaps) == list(original.swaps)
    assert "secret-token" not in repr(loaded)
    assert await second.sessions.load("s-2") is None
    assert [r.id for r in await second.sessions.records()] == ["s-1"]

    loaded.accepted = frozenset({"weather"})
    loaded.listed_epochs["weather"] = 4
    await second.sessions.save([loaded])
    again = await first.sessions.load("s-1")
    assert again is not None and again.accepted == {"weather"} and again.listed_epochs == {"weather": 4}

    await first.sessions.delete(again)
    assert await second.sessions.load("s-1") is None
    await second.sessions.save([again])  # saving an ended session does not bring it back
    assert await first.sessions.load("s-1") is None


async def test_what_a_client_declared_is_read_by_another_replica(replicas: tuple[State, State]) -> None:
    first, second = replicas
    original = record()
    original.client_capabilities = '{"sampling":{}}'
    await first.sessions.create(original)
    loaded = await second.sessions.load("s-1")
    assert loaded is not None and (loaded.client_capabilities, loaded.log_level) == ('{"sampling":{}}', "")

    assert await second.sessions.set_log_level(loaded, "warning")
    again = await first.sessions.load("s-1")
    assert again is not None and again.log_level == "warning"

    await first.sessions.delete(again)
    assert not await second.sessions.set_log_level(loaded, "error")  # an ended session stays ended
    assert await first.sessions.load("s-1") is None


async def test_a_principal_has_one_implied_session_whichever_replica_creates_it(
    replicas: tuple[State, State],
) -> None:
    first, second = replicas
    ids = await asyncio.gather(
        first.sessions.create(record("s-a", implied=True)),
        second.sessions.create(record("s-b", implied=True)),
    )
    assert ids[0] == ids[1] and await first.sessions.implied(ALICE) == ids[0]
    assert [r.id for r in await second.sessions.records()] == [ids[0]]


async def test_a_use_renews_a_sessions_time_to_live_and_the_sweep_drops_an_expired_one(
    replicas: tuple[State, State], redis_client: aredis.Redis
) -> None:
    first, second = replicas
    await first.sessions.create(record("s-1", implied=True))
    await first.sessions.create(record("s-2"))
    await redis_client.pexpire(KEYS.session("s-1"), 5_000)
    assert await second.sessions.load("s-1") is not None  # a use
    assert await redis_client.pttl(KEYS.session("s-1")) > 50_000
    assert await redis_client.pttl(KEYS.swaps("s-1")) > 50_000

    await redis_client.pexpire(KEYS.session("s-1"), 1)
    await until_within(lambda: _gone(redis_client, "s-1"), "the unused session expires")
    assert await second.sessions.load("s-1") is None
    assert await redis_client.sismember(KEYS.sessions, "s-1") and await redis_client.hlen(KEYS.implied) == 1
    assert first.shared is not None
    await redis_client.pexpire(KEYS.listing(listing_digest(LISTING)), 5_000)
    assert await first.shared.sweep([]) == 1
    assert (
        not await redis_client.sismember(KEYS.sessions, "s-1") and await redis_client.hlen(KEYS.implied) == 0
    )
    assert await redis_client.sismember(KEYS.sessions, "s-2")
    assert await redis_client.pttl(KEYS.listing(listing_digest(LISTING))) > 50_000  # s-2 still refers to it


async def _gone(redis_client: aredis.Redis, session_id: str) -> bool:
    return not await redis_client.exists(KEYS.session(session_id))


async def test_version_numbers_grow_by_one_per_swap_when_two_replicas_swap_at_once(
    replicas: tuple[State, State],
) -> None:
    first, second = replicas
    await first.sessions.create(record())
    won = 0
    for round_ in range(20):
        seen = await asyncio.gather(first.sessions.load("s-1"), second.sessions.load("s-1"))
        assert seen[0] is not None and seen[1] is not None and seen[0].ref == seen[1].ref
        # even rounds: both replicas saw the same change; odd rounds: each computed another one
        targets = [f"{round_:032}"] * 2 if round_ % 2 == 0 else [f"{round_:031}x", f"{round_:031}y"]
        changes = [
            state.sessions.swap([SwapChange(r, fp, (("nba", "e" * 24),), f"round {round_}", time.time())])
            for state, r, fp in zip(replicas, seen, targets, strict=True)
        ]
        numbers = [n for (n,) in await asyncio.gather(*changes)]
        assert sorted(numbers) == [0, seen[0].ref.number + 1]  # exactly one swap, numbered next
        won += 1
    final = await first.sessions.load("s-1")
    assert final is not None and final.ref.number == 1 + won
    swaps = list(final.swaps)
    assert len(swaps) == 8 and [s.current.number for s in swaps] == list(
        range(final.ref.number - 7, final.ref.number + 1)
    )
    assert all(s.previous is not None and s.previous.number == s.current.number - 1 for s in swaps)
    assert all(
        a.current.fingerprint == b.previous.fingerprint for a, b in itertools.pairwise(swaps) if b.previous
    )
    unchanged = SwapChange(final, final.ref.fingerprint, final.catalog, "same tools", time.time())
    assert await second.sessions.swap([unchanged]) == [0]  # the same fingerprint is not a new version


async def test_one_replica_holds_the_lease_and_another_takes_it_over_after_it_expires(
    redis_server: RedisServer, redis_client: aredis.Redis
) -> None:
    a, b = (
        RedisLease(redis_client, KEYS, ttl=0.5, holder="a"),
        RedisLease(redis_client, KEYS, ttl=0.5, holder="b"),
    )
    assert await a.acquire() and a.held
    assert not await b.acquire() and not b.held
    assert await a.acquire() and not await b.acquire()  # renewed
    # a stops renewing, as a killed replica would: it stops counting itself the holder before expiry
    await until_within(lambda: _false(a.held), "a's own bound passes")
    assert await redis_client.get(KEYS.lease) in (b"a", None)
    assert await until_within(b.acquire, "b takes the lease over")
    assert b.held and not await a.acquire()
    await b.release()
    assert not b.held and await a.acquire()


async def _false(value: bool) -> bool:
    return not value


async def test_embeddings_one_replica_stored_are_read_by_another_without_model_calls(
    replicas: tuple[State, State],
) -> None:
    texts = ["weather forecast for tomorrow", "nba teams", "a cocktail with rum"]
    stored = Embeddings(FakeEmbedder(), store=replicas[0].embeddings)
    vectors = stored.embed_documents(texts)
    assert stored.model_calls == 1
    reader = Embeddings(FakeEmbedder(), store=replicas[1].embeddings)
    assert np.array_equal(reader.embed_documents(texts), vectors)
    assert reader.model_calls == 0 and reader.cache_hits == 3


async def test_health_and_listings_round_trip_with_a_growing_generation(
    replicas: tuple[State, State],
) -> None:
    first, second = replicas
    assert first.shared is not None and second.shared is not None
    digest = listing_digest(LISTING)
    await first.shared.catalogs.put([(digest, LISTING)])
    assert (await second.shared.catalogs.get([digest, "missing"]))[digest].tools == LISTING.tools
    assert await second.shared.health.generation() == 0
    healthy = BackendHealth("healthy", digest, 1, "2025-11-25", 0.1)
    assert await first.shared.health.publish({"weather": healthy}) == 1
    down = BackendHealth("unhealthy", digest, 1, last_error="connection refused", consecutive_failures=1)
    assert await first.shared.health.publish({"weather": down}) == 2
    assert await second.shared.health.load() == (2, {"weather": down})


async def test_events_reach_every_replica(replicas: tuple[State, State]) -> None:
    first, second = replicas
    assert first.shared is not None and second.shared is not None
    received: list[dict[str, Any]] = []

    async def listen() -> None:
        async for message in second.shared.events.listen():  # type: ignore[union-attr]
            received.append(message)

    listener = asyncio.create_task(listen())
    try:
        await until_within(lambda: _publish_and_check(first, received), "an event arrives")
    finally:
        listener.cancel()
    assert received[0] == {"kind": "health", "generation": 7}


async def _publish_and_check(state: State, received: list[dict[str, Any]]) -> bool:
    assert state.shared is not None
    await state.shared.events.publish({"kind": "health", "generation": 7})  # until the listener subscribed
    return bool(received)


async def test_a_redis_outage_is_a_state_error_within_the_timeout_and_embeddings_fall_back(
    tmp_path: Path,
) -> None:
    with running_redis(tmp_path / "redis") as lost:
        state = await open_state(lost.url, "fake:test", 64)
        await state.sessions.create(record())
        lost.stop()
        started = time.monotonic()
        with pytest.raises(StateUnavailable, match="shared state unavailable while reading a session"):
            await state.sessions.load("s-1")
        assert time.monotonic() - started < 2 * TIMEOUT + 1
        embeddings = Embeddings(FakeEmbedder(), store=state.embeddings)
        assert embeddings.embed_documents(["still answers"]).shape == (1, 64)
        embeddings.close()
        await state.close()
    with pytest.raises(StateUnavailable, match="connecting"):
        await open_state(lost.url, "fake:test", 64)


async def test_a_backend_session_one_replica_keeps_is_read_by_another_and_ended_after_expiry(
    replicas: tuple[State, State], redis_client: aredis.Redis
) -> None:
    first, second = replicas
    await first.sessions.create(record("s-1"))
    loaded = await second.sessions.load("s-1")
    assert loaded is not None and loaded.backend_sessions == {}
    kept = BackendSession("backend-session-1", "2025-11-25")
    assert await second.sessions.set_backend_session(loaded, "weather", "", kept) == kept
    # a replica that saw none is too late: the stored one wins
    late = BackendSession("backend-session-2", "2025-11-25")
    assert await first.sessions.set_backend_session(loaded, "weather", "", late) == kept
    again = await first.sessions.load("s-1")
    assert again is not None and again.backend_sessions == {"weather": kept}
    # the one that replaces a forgotten session names it
    assert await first.sessions.set_backend_session(again, "weather", kept.session_id, late) == late

    await redis_client.pexpire(KEYS.session("s-1"), 1)
    await until_within(lambda: _gone(redis_client, "s-1"), "the unused session expires")
    assert await first.sessions.set_backend_session(again, "weather", "", kept) is None
    assert first.shared is not None
    assert await first.shared.sweep([]) == 1
    assert first.sessions.take_expired() == [EndedSession("s-1", None, {"weather": late})]
    assert first.sessions.take_expired() == []  # each once
    assert not await redis_client.exists(KEYS.backend_sessions("s-1"))
