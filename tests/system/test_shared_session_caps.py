"""The session caps with the Redis state: counted in the shared state, so they hold across replicas
and through a replica's restart; an expired or ended session gives its place back.

Against a real redis-server: two state backends (or two indexers, in process, with the fake
embedder) on one Redis stand for two replicas. Each test starts from an empty database; waits are on
conditions with bounded timeouts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import redis.asyncio as aredis

from indexer.api.process import IndexerProcess
from indexer.backends.credentials import ANONYMOUS
from indexer.errors import SessionsFull, TooManySessions
from indexer.state import Room, RoomFull, SessionRecord, State, Swap
from indexer.state.redis import Keys
from indexer.state.redis_sessions import principal_key
from tests.support.clients import until
from tests.support.indexers import running_indexer
from tests.support.redis import RedisServer, open_state
from toolsearch.config import parse_config
from toolsearch.sessions import Principal, VersionRef

WAIT = 15.0  # seconds any condition may take at most
ALICE = Principal("https://issuer.test", "alice")
BOB = Principal("https://issuer.test", "bob")
TOKEN_HOLDER = Principal("", "unverified-bearer")
KEYS = Keys()


@pytest.fixture
async def states(redis_server: RedisServer, redis_client: aredis.Redis) -> AsyncIterator[list[State]]:
    """State backends on the one Redis, opened as replicas would open them; closed after the test."""
    opened: list[State] = []
    async with AsyncExitStack() as cleanup:

        async def close_all() -> None:
            for state in opened:
                await state.close()

        cleanup.push_async_callback(close_all)
        for _ in range(2):
            opened.append(await open_state(redis_server.url, "fake:test", 64, session_ttl=60.0))
        yield opened


def record(session_id: str, principal: Principal = ALICE, token: str | None = None) -> SessionRecord:
    created = SessionRecord(
        id=session_id,
        principal=principal,
        token=token,
        implied=False,
        accepted=frozenset(),
        rejected_at_creation=frozenset(),
        own_listings={},
        ref=VersionRef(1, "a" * 32),
        catalog=(),
    )
    created.swaps.append(Swap(None, created.ref, "created", 1700000000.0))
    return created


async def test_a_principal_cap_holds_across_replicas_and_through_a_restart(
    redis_server: RedisServer, states: list[State], redis_client: aredis.Redis
) -> None:
    first, second = states
    room = Room(sessions=0, per_principal=3)
    for number in range(3):
        await states[number % 2].sessions.create(record(f"s-{number}"), room)
    with pytest.raises(RoomFull) as full:
        await second.sessions.create(record("s-3"), room)
    assert (full.value.scope, full.value.limit) == ("principal", 3) and 0 < full.value.frees_in <= 60
    assert not await redis_client.exists(KEYS.session("s-3"))  # refused: nothing stored
    await second.sessions.create(record("b-0", BOB), room)  # another principal has its own count
    # a replica restarts: the count was never its own
    await first.close()
    restarted = states[0] = await open_state(redis_server.url, "fake:test", 64, session_ttl=60.0)
    with pytest.raises(RoomFull):
        await restarted.sessions.check(ALICE, room)
    ended = await restarted.sessions.load("s-0")
    assert ended is not None
    await restarted.sessions.delete(ended)  # an end on one replica frees the place on every one
    await second.sessions.create(record("s-3"), room)
    assert await redis_client.zcard(KEYS.owned(principal_key(ALICE))) == 3


async def test_creations_at_once_on_two_replicas_never_pass_the_cap_on_every_session(
    states: list[State], redis_client: aredis.Redis
) -> None:
    room = Room(sessions=7, per_principal=0)  # anonymous callers: the per-principal cap is not theirs
    attempts = [states[n % 2].sessions.create(record(f"s-{n}", ANONYMOUS), room) for n in range(20)]
    answers = await asyncio.gather(*attempts, return_exceptions=True)
    refusals = [a for a in answers if isinstance(a, RoomFull)]
    assert len(refusals) == 13 and all(r.scope == "sessions" and r.limit == 7 for r in refusals)
    assert await redis_client.zcard(KEYS.expiry) == 7 and await redis_client.scard(KEYS.sessions) == 7
    assert not await redis_client.keys(f"{KEYS.prefix}principal:*")  # uncounted principals keep no set


async def test_a_use_renews_a_sessions_place_and_an_expired_one_gives_it_back(
    redis_server: RedisServer, states: list[State], redis_client: aredis.Redis
) -> None:
    short = await open_state(redis_server.url, "fake:test", 64, session_ttl=1.0)
    states.append(short)
    room = Room(sessions=0, per_principal=2)
    await short.sessions.create(record("s-0"), room)
    await short.sessions.create(record("s-1"), room)
    owned = KEYS.owned(principal_key(ALICE))
    # as if s-0 had been idle for most of its time to live; a use gives it all of it again
    await redis_client.zadd(owned, {"s-0": 1}, xx=True)
    await redis_client.zadd(KEYS.expiry, {"s-0": 1}, xx=True)
    await redis_client.pexpire(KEYS.session("s-0"), 60_000)
    assert await short.sessions.load("s-0") is not None
    clock, _ = await redis_client.time()
    for key in (owned, KEYS.expiry):
        score = await redis_client.zscore(key, "s-0")
        assert score is not None and score > clock * 1000
    assert 0 < await redis_client.pttl(KEYS.session("s-0")) <= 1000  # the store's own time to live again

    async def room_again() -> bool:
        try:
            await short.sessions.create(record("s-2"), room)
        except RoomFull:
            return False
        return True

    await until(room_again, "an expired session gives its place back", WAIT)
    members = {
        m.decode() if isinstance(m, bytes) else str(m) for m in await redis_client.zrange(owned, 0, -1)
    }
    assert "s-2" in members and len(members) <= 2


def replica_config(tmp: Path, url: str) -> dict[str, object]:
    return {
        "indexer": {
            "state": url,
            "cache_dir": str(tmp / "cache"),
            "max_sessions": 4,
            "max_sessions_per_principal": 2,
            "health": {"enabled": False},
        }
    }


async def test_two_indexers_on_one_redis_share_both_caps_and_keep_no_unneeded_token(
    tmp_path: Path, redis_server: RedisServer, redis_client: aredis.Redis
) -> None:
    config = parse_config(replica_config(tmp_path, redis_server.url), tmp_path / "toolsearch.yaml")
    async with running_indexer(config, {}) as one, running_indexer(config, {}) as two:
        replicas: tuple[IndexerProcess, IndexerProcess] = (one, two)
        await one.sessions.open(ALICE, "alice-token")
        await two.sessions.open(ALICE, "alice-token")
        with pytest.raises(TooManySessions, match="this caller holds 2 sessions"):
            await one.sessions.open(ALICE, "alice-token")
        held = await two.sessions.open(TOKEN_HOLDER, "an-unverified-token")
        # no passthrough backend would ever list with it: the shared state never holds it
        assert not await redis_client.hexists(KEYS.session(held.id), "token")
        await one.sessions.open(ANONYMOUS, None)
        with pytest.raises(SessionsFull, match="the indexer holds 4 sessions") as full:
            await replicas[1].sessions.open(BOB, "bob-token")
        assert 1 <= full.value.retry_after <= 300
        await one.sessions.close(held.id, TOKEN_HOLDER)
        await two.sessions.open(BOB, "bob-token")


async def test_an_open_sent_to_both_replicas_under_one_proposed_id_is_one_session_counted_once(
    tmp_path: Path, redis_server: RedisServer, redis_client: aredis.Redis
) -> None:
    config = parse_config(replica_config(tmp_path, redis_server.url), tmp_path / "toolsearch.yaml")
    async with running_indexer(config, {}) as one, running_indexer(config, {}) as two:
        proposed = "r" * 32  # a router's: its first attempt ran on one, its second went to the other
        first = await one.sessions.open(ALICE, "alice-token", session_id=proposed)
        again = await two.sessions.open(ALICE, "alice-token", session_id=proposed)
        assert first.id == again.id == proposed
        assert await redis_client.zcard(KEYS.owned(principal_key(ALICE))) == 1
        await two.sessions.open(ALICE, "alice-token")  # the cap of 2 has room for one more
        with pytest.raises(TooManySessions):
            await one.sessions.open(ALICE, "alice-token")
