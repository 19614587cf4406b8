"""Long polls on a session's backend sessions: woken when any replica records a new one (or a
subscription the session's standalone stream must ask a backend for).

A router replica holding a client's standalone stream listens in every backend session the client
session keeps (router/upstream/session_wide/backend_streams.py). It asks `BackendSessions` with
the `stamp` of the set it knows, and the answer waits here until that set changes or the wait
ends. A change on this replica wakes the waiters at once (`changed`); one on another replica
reaches this one as an event of the shared state (`indexer.upkeep.replica`), which calls `changed`
too. Events are hints: one that is lost costs the waiter the rest of its wait, after which it reads
the set again.

Bounds: `MAX_WAITERS` long polls at once on this replica (beyond, an answer comes without waiting),
each at most `MAX_WAIT` seconds. On stop every waiter is woken, so a draining server is not held.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from indexer.state import SessionRecord

MAX_WAITERS = 10_000  # long polls waiting at once on one replica
MAX_WAIT = 30.0  # seconds one long poll may wait


def stamp_of(record: SessionRecord) -> str:
    """A short name for a session's backend sessions and subscriptions: equal sets, equal stamps."""
    digest = hashlib.sha256()
    for backend_id, session in sorted(record.backend_sessions.items()):
        digest.update(f"{backend_id}\0{session.session_id}\0{session.protocol_version}\0".encode())
    for backend_id, uri in sorted(record.subscriptions):
        digest.update(f"\1{backend_id}\0{uri}\0".encode())
    return digest.hexdigest()[:32]


@dataclass(eq=False)
class _Change:
    """One session's change to come: set when it happens; how many waiters hold it."""

    happened: asyncio.Event = field(default_factory=asyncio.Event)
    holders: int = 0


class BackendSessionWaits:
    """The long polls waiting on sessions' backend sessions, by session id."""

    def __init__(self, max_waiters: int = MAX_WAITERS) -> None:
        self._max_waiters = max_waiters
        self._changes: dict[str, _Change] = {}  # the sessions waited on, until they change
        self.waiting = 0  # long polls waiting now
        self._closed = False

    @contextlib.contextmanager
    def watching(self, session_id: str) -> Iterator[asyncio.Event | None]:
        """The event set when the session's backend sessions change, from now until the block ends;
        None when this replica waits on as many as it may, or is stopping (then: do not wait).

        Enter it before reading the set, so that a change in between is not missed."""
        if self._closed or self.waiting >= self._max_waiters:
            yield None
            return
        change = self._changes.setdefault(session_id, _Change())
        change.holders += 1
        self.waiting += 1
        try:
            yield change.happened
        finally:
            self.waiting -= 1
            change.holders -= 1
            if not change.holders and self._changes.get(session_id) is change:
                del self._changes[session_id]

    def changed(self, session_id: str) -> None:
        """The session's backend sessions changed (here or on another replica): wake its waiters."""
        change = self._changes.pop(session_id, None)
        if change is not None:
            change.happened.set()  # its waiters read the set again; later ones get a new change

    def close(self) -> None:
        """Wake every waiter and let no new one wait: the server is stopping."""
        self._closed = True
        for change in self._changes.values():
            change.happened.set()
        self._changes.clear()
