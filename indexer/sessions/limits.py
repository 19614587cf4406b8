"""The caps on sessions: how many may live at once, and how many one principal may hold.

The session store counts live sessions (one that expired has given its place back) and checks a
new one against the caps atomically with storing it (`indexer.state.Room`), so a burst of opens
cannot slip past a cap between the check and the creation, and replicas sharing Redis count in the
shared state rather than each its own (a restart resets nothing). The cap on one principal applies
to authenticated principals only: anonymous callers and unverified token holders are many callers
under one principal each, and capping them together would lock all of them out; the cap on every
session bounds them too. A refusal says which cap, its value, how to free a place and when one
frees by itself, and carries that time as a retry hint (the router's Retry-After).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from indexer.backends.credentials import authenticated
from indexer.errors import SessionsFull, TooManySessions
from indexer.state import Room, RoomFull, SessionRecord, SessionStore
from toolsearch.sessions import Principal

RETRY_AFTER_MAX = 300  # seconds: room may free sooner than by expiry (a DELETE), so hint no later
_CLOSE = "close sessions no longer used (DELETE /mcp with their Mcp-Session-Id)"


def _duration(seconds: float) -> str:
    """A wait as people read it: 40s, 12 min, 23 h."""
    if seconds < 90:
        return f"{max(1, math.ceil(seconds))}s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{round(seconds / 3600)} h"


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """The configured caps (0: none), as the room a principal's new session needs and its refusals."""

    sessions: int = 0  # live sessions over every principal: indexer.max_sessions
    per_principal: int = 0  # one authenticated principal's: indexer.max_sessions_per_principal

    def room(self, principal: Principal) -> Room:
        """The caps a new session of `principal` must fit under."""
        return Room(self.sessions, self.per_principal if authenticated(principal) else 0)

    async def check(self, store: SessionStore, principal: Principal) -> None:
        """Refuse a session of `principal` that would not fit now, before anything is done for it."""
        try:
            await store.check(principal, self.room(principal))
        except RoomFull as exc:
            raise self.refusal(exc) from None

    async def create(self, store: SessionStore, record: SessionRecord) -> str:
        """Store a new session if it fits, checked atomically with the creation; returns its id."""
        try:
            return await store.create(record, self.room(record.principal))
        except RoomFull as exc:
            raise self.refusal(exc) from None

    def refusal(self, full: RoomFull) -> TooManySessions:
        """The indexer's error for a store's refusal, with what to do about it."""
        retry_after = max(1, min(RETRY_AFTER_MAX, math.ceil(full.frees_in)))
        expiry = f"the least recently used one expires in {_duration(full.frees_in)} unless used"
        if full.scope == "sessions":
            return SessionsFull(
                f"the indexer holds {full.limit} sessions, the most indexer.max_sessions allows: "
                f"{_CLOSE}, or retry later ({expiry})",
                retry_after,
            )
        return TooManySessions(
            f"this caller holds {full.limit} sessions, the most indexer.max_sessions_per_principal "
            f"allows: {_CLOSE}, or retry later ({expiry})",
            retry_after,
        )
