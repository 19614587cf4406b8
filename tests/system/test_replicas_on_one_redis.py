"""Indexer replicas on one real redis-server, in the test's process: what one keeps, another reads.

Call streams and input rounds kept through one replica's store are read through another's and expire
by themselves; a long poll on one replica is woken by a change made through another; a replica that
does not lead hands a probe it is asked for to the one that does. The indexers run in the test's
event loop with the fake embedder (the memory state's side of each is in tests/indexer/); Redis is
the process that puts these tests here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import redis.asyncio as aredis

from commands.catalog_server import CatalogServerSettings
from indexer.sessions.backend_session_waits import MAX_WAIT, stamp_of
from indexer.sessions.manager import SessionManager
from indexer.sessions.views import LiveSession
from indexer.state.redis import Keys
from indexer.state.rounds import RedisRounds
from indexer.state.stream_events import RedisStreams
from tests.support.catalogs import small_catalog
from tests.support.clients import until
from tests.support.in_process import catalog_server_in_process
from tests.support.indexers import running_indexer
from tests.support.redis import RedisServer
from tests.support.stream_stores import STREAM, keep, kept_in_order
from tests.support.waits import wait_for
from toolsearch.config import Config, parse_config
from toolsearch.kept_streams import KeptEvents, StreamEnd
from toolsearch.sessions import BackendSession, Principal, Subscription

TOKEN = "a-token-of-the-routers-own"
ALICE = Principal("https://issuer.test", "alice")
WOKEN = MAX_WAIT / 3  # seconds a woken long poll may take at most: the change answers it, not the wait
NOTES = BackendSession("backend-session-1", "2025-11-25")
NOTE_A, NOTE_B = Subscription("notes", "notes://a"), Subscription("notes", "notes://b")
WEATHER = "AI_Weather_by_Meteosource"
SLOW_HEALTH = {"interval": 3600.0, "timeout": 10.0, "unhealthy_after": 1}  # a probe seen is one asked for


def config_of(tmp: Path, redis_url: str, health: Any = None, servers: Any = ()) -> Config:
    """An indexer on the Redis at `redis_url`, probing nothing unless `health` says otherwise."""
    indexer = {"state": redis_url, "cache_dir": str(tmp / "cache"), "health": health or {"enabled": False}}
    raw = {"indexer": indexer, "catalog_servers": list(servers)}
    return parse_config(raw, tmp / "toolsearch.yaml")


async def test_redis_keeps_a_stream_the_same_way_for_every_replica(redis_server: RedisServer) -> None:
    client = aredis.Redis.from_url(redis_server.url)
    try:
        await kept_in_order(RedisStreams(client, Keys("streams-test:")))
        other = RedisStreams(client, Keys("streams-test:"))  # another replica's
        assert (await other.read("one", STREAM, 2, 10)) == KeptEvents(("e3",), StreamEnd.DONE, "7")
    finally:
        await client.aclose()


async def test_a_redis_stream_expires_by_itself(redis_server: RedisServer) -> None:
    client = aredis.Redis.from_url(redis_server.url)
    try:
        streams = RedisStreams(client, Keys("streams-expiry:"))
        await streams.keep(keep(1, "e1", ttl=0.3))
        assert 0 < await client.pttl(f"streams-expiry:stream:one:{STREAM}") <= 300

        async def expired() -> bool:
            return await streams.read("one", STREAM, 0, 10) is None

        await until(expired, "the stream expired in Redis", timeout=10)
    finally:
        await client.aclose()


async def test_redis_rounds_are_shared_by_session_and_expire_by_themselves(redis_server: RedisServer) -> None:
    client = aredis.Redis.from_url(redis_server.url)
    try:
        one, other = RedisRounds(client, Keys("rounds-test:")), RedisRounds(client, Keys("rounds-test:"))
        await one.put("session", TOKEN, '{"state":"asked"}', 0.3)
        assert await other.get("session", TOKEN) == '{"state":"asked"}'  # another replica reads it
        assert await other.get("another session", TOKEN) is None
        assert 0 < await client.pttl(f"rounds-test:round:session:{TOKEN}") <= 300

        async def expired() -> bool:
            return await other.get("session", TOKEN) is None

        await until(expired, "the round expired in Redis", timeout=10)
    finally:
        await client.aclose()


@asynccontextmanager
async def polled_on_one_replica(
    tmp: Path, redis_url: str
) -> AsyncIterator[tuple[SessionManager, SessionManager, LiveSession, asyncio.Task[LiveSession]]]:
    """Two indexers on one Redis (two replicas), a session of Alice's opened through the first, and
    a long poll there on what it keeps now; yields both replicas' sessions, the session, the poll."""
    config = config_of(tmp, redis_url)
    async with running_indexer(config, {}) as one, running_indexer(config, {}) as two:
        opened = await one.sessions.open(ALICE, None)
        seen = stamp_of(opened.record)
        poll = asyncio.create_task(one.sessions.backend_sessions(opened.id, ALICE, seen, MAX_WAIT))
        await asyncio.sleep(0)
        yield one.sessions, two.sessions, opened, poll


async def test_a_long_poll_on_one_replica_is_woken_by_a_backend_session_kept_through_another(
    tmp_path: Path, redis_server: RedisServer, redis_client: aredis.Redis
) -> None:
    async with polled_on_one_replica(tmp_path, redis_server.url) as (_, other, opened, poll):
        await other.set_backend_session(opened.id, ALICE, "notes", "", NOTES)
        answered = await asyncio.wait_for(poll, WOKEN)  # the shared state's event woke it
    assert dict(answered.record.backend_sessions) == {"notes": NOTES}


async def test_a_subscription_kept_through_one_replica_wakes_a_long_poll_on_another_and_is_read_there(
    tmp_path: Path, redis_server: RedisServer, redis_client: aredis.Redis
) -> None:
    async with polled_on_one_replica(tmp_path, redis_server.url) as (first, other, opened, poll):
        # two subscriptions at once through the other replica: the store keeps both
        await asyncio.gather(
            other.subscribe(opened.id, ALICE, NOTE_A, True), other.subscribe(opened.id, ALICE, NOTE_B, True)
        )
        answered = await asyncio.wait_for(poll, WOKEN)
        assert answered.record.subscriptions  # one of them, at least, woke it
        read = await first.backend_sessions(opened.id, ALICE)
        assert read.record.subscriptions == {NOTE_A, NOTE_B}
        await first.subscribe(opened.id, ALICE, NOTE_A, False)
        assert (await other.backend_sessions(opened.id, ALICE)).record.subscriptions == {NOTE_B}


async def test_a_replica_that_probes_nothing_hands_the_ask_to_the_one_that_does(
    tmp_path: Path, redis_server: RedisServer, redis_client: aredis.Redis
) -> None:
    catalog = tmp_path / "catalog.jsonl"
    small_catalog(catalog)
    with catalog_server_in_process(catalog, CatalogServerSettings(control=True)) as url:
        servers = [{"catalog": str(catalog), "listen": url.removeprefix("http://")}]
        config = config_of(tmp_path, redis_server.url, SLOW_HEALTH, servers)
        async with running_indexer(config, {}) as leader, running_indexer(config, {}) as follower:
            assert leader.state.leadership.leads and not follower.state.leadership.leads
            httpx2.post(f"{url}/control/servers/{WEATHER}/down", timeout=5).raise_for_status()
            await follower.tools_changed(WEATHER)
            # the lease holder probed, and the follower adopted its verdict
            await wait_for(lambda: follower.registry.get(WEATHER).status == "unhealthy")
            assert leader.registry.get(WEATHER).status == "unhealthy"
