"""A look at a session's backend sessions (and subscriptions) waits for their change and is woken by
it, on any replica.

In process, with the fake embedder: indexers on the memory state (two on one real Redis, standing for
two replicas, are in tests/system/test_replicas_on_one_redis.py). Each long poll asks for the longest
wait there is (`MAX_WAIT`), and the test allows it a third of that: it passes only when the change,
not the end of the wait, answers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from indexer.errors import InvalidRequest, SessionNotFound
from indexer.sessions.backend_session_waits import MAX_WAIT, BackendSessionWaits, stamp_of
from indexer.sessions.manager import MAX_SUBSCRIPTIONS, SessionManager
from indexer.sessions.views import LiveSession
from tests.support.indexers import running_indexer
from toolsearch.config import Config, parse_config
from toolsearch.sessions import BackendSession, Principal, Subscription

ALICE = Principal("https://issuer.test", "alice")
WOKEN = MAX_WAIT / 3  # seconds a woken long poll may take at most
NOTES = BackendSession("backend-session-1", "2025-11-25")
NOTE_A, NOTE_B = Subscription("notes", "notes://a"), Subscription("notes", "notes://b")


def config_of(tmp: Path) -> Config:
    indexer = {"state": "memory", "cache_dir": str(tmp / "cache"), "health": {"enabled": False}}
    return parse_config({"indexer": indexer}, tmp / "toolsearch.yaml")


@asynccontextmanager
async def one_session(tmp: Path) -> AsyncIterator[tuple[SessionManager, LiveSession]]:
    """An indexer on the memory state, and a session of Alice's opened in it."""
    async with running_indexer(config_of(tmp), {}) as indexer:
        yield indexer.sessions, await indexer.sessions.open(ALICE, None)


async def test_a_long_poll_answers_when_a_backend_session_is_kept_not_at_the_end_of_its_wait(
    tmp_path: Path,
) -> None:
    async with one_session(tmp_path) as (sessions, opened):
        seen = stamp_of(opened.record)
        poll = asyncio.create_task(sessions.backend_sessions(opened.id, ALICE, seen, MAX_WAIT))
        await asyncio.sleep(0)
        assert not poll.done()  # the set it saw has not changed: it waits
        await sessions.set_backend_session(opened.id, ALICE, "notes", "", NOTES)
        answered = await asyncio.wait_for(poll, WOKEN)
    assert dict(answered.record.backend_sessions) == {"notes": NOTES}
    assert stamp_of(answered.record) != seen


async def test_a_long_poll_with_another_stamp_answers_at_once_and_an_ended_session_is_not_found(
    tmp_path: Path,
) -> None:
    async with one_session(tmp_path) as (sessions, opened):
        await sessions.set_backend_session(opened.id, ALICE, "notes", "", NOTES)
        # a stamp from before the change, or none: the answer comes without waiting
        stale = await asyncio.wait_for(sessions.backend_sessions(opened.id, ALICE, "old", MAX_WAIT), WOKEN)
        assert dict(stale.record.backend_sessions) == {"notes": NOTES}
        seen = stamp_of(stale.record)
        poll = asyncio.create_task(sessions.backend_sessions(opened.id, ALICE, seen, MAX_WAIT))
        await asyncio.sleep(0)
        await sessions.close(opened.id, ALICE)
        with pytest.raises(SessionNotFound):
            await asyncio.wait_for(poll, WOKEN)


async def test_a_session_keeps_a_bounded_number_of_subscriptions_and_says_how_to_make_room(
    tmp_path: Path,
) -> None:
    async with one_session(tmp_path) as (sessions, opened):
        for n in range(MAX_SUBSCRIPTIONS):
            await sessions.subscribe(opened.id, ALICE, Subscription("notes", f"notes://{n}"), True)
        await sessions.subscribe(opened.id, ALICE, Subscription("notes", "notes://0"), True)  # kept already
        with pytest.raises(InvalidRequest, match="at most 64 subscriptions: unsubscribe from one first"):
            await sessions.subscribe(opened.id, ALICE, NOTE_A, True)
        await sessions.subscribe(opened.id, ALICE, Subscription("notes", "notes://0"), False)
        await sessions.subscribe(opened.id, ALICE, NOTE_A, True)  # room again
        assert len(opened.record.subscriptions) == MAX_SUBSCRIPTIONS and NOTE_A in opened.record.subscriptions
        await sessions.close(opened.id, ALICE)
        with pytest.raises(SessionNotFound):
            await sessions.subscribe(opened.id, ALICE, NOTE_B, True)


async def test_waits_are_bounded_and_stopping_wakes_every_one() -> None:
    waits = BackendSessionWaits(max_waiters=2)
    with waits.watching("a") as first, waits.watching("b") as second, waits.watching("c") as third:
        assert first is not None and second is not None
        assert third is None  # beyond the bound: the answer comes without waiting
        assert waits.waiting == 2
        waits.close()
        assert first.is_set() and second.is_set()
        with waits.watching("d") as after:
            assert after is None  # stopping: nobody waits any more
    assert waits.waiting == 0


async def test_a_change_wakes_only_its_own_sessions_waiters_and_later_ones_wait_for_the_next() -> None:
    waits = BackendSessionWaits()
    with waits.watching("a") as early, waits.watching("b") as other:
        assert early is not None and other is not None
        waits.changed("a")
        assert early.is_set() and not other.is_set()
        with waits.watching("a") as later:
            assert later is not None and not later.is_set()
    assert waits.waiting == 0
