"""The embedded state: one indexer process, sessions in its memory, embeddings in a SQLite file.

Nothing is shared, so nothing is serialised: the session store keeps the very records the session
manager works on, a swap is checked and counted here and applied by the manager, and there is no
lease (this process always probes and rebuilds) and no event channel. The embeddings' SQLite file is
`indexer.state.disk`.

Sessions are bounded as in Redis: each lives `ttl` seconds after its last use (sliding), and
`create` refuses one beyond the caps it is given. Records are kept in the order of their last use,
so the expired ones are always at the front: every call first drops those whose time has passed,
which costs one comparison when none has, and the caps count live sessions only.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from indexer.state.base import NO_CAPS, EndedSession, Room, RoomFull, SessionRecord, SwapChange, caller_digest
from toolsearch.sessions import BackendSession, Principal, Subscription

# expired sessions whose backend sessions wait to be ended; beyond it the oldest are dropped, and
# their backends end them on their own idle timeouts
ENDED_KEPT = 10_000


class _Held(NamedTuple):
    """A stored session and the monotonic time it expires at, unless used again."""

    record: SessionRecord
    expires: float


class LocalSessions:
    """The `SessionStore` of a single indexer: the process's own session records, by id."""

    shared = False

    def __init__(self, ttl: float = 86_400.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._clock = clock
        self._held: OrderedDict[str, _Held] = OrderedDict()  # least recently used first
        # the sessions of each counted principal (those created under a per-principal cap), in use order
        self._owned: dict[Principal, OrderedDict[str, None]] = {}
        self._implied: dict[tuple[Principal, str], str] = {}  # by principal and caller_digest
        self._ended: deque[EndedSession] = deque(maxlen=ENDED_KEPT)

    def __len__(self) -> int:
        return len(self._held)

    @property
    def ttl(self) -> float:
        return self._ttl

    def _expire(self) -> float:
        """Drop the sessions whose time has passed; returns now."""
        now = self._clock()
        while self._held:
            oldest = next(iter(self._held.values()))
            if oldest.expires > now:
                break
            self._drop(oldest.record)
            if oldest.record.backend_sessions:
                record = oldest.record
                self._ended.append(EndedSession(record.id, record.token, dict(record.backend_sessions)))
        return now

    def _drop(self, record: SessionRecord) -> None:
        self._held.pop(record.id, None)
        owned = self._owned.get(record.principal)
        if owned is not None:
            owned.pop(record.id, None)
            if not owned:
                del self._owned[record.principal]
        if self._implied.get(key := _implied_key(record)) == record.id:
            del self._implied[key]

    def _refusal(self, principal: Principal, room: Room, now: float) -> RoomFull | None:
        if room.sessions and len(self._held) >= room.sessions:
            oldest = next(iter(self._held.values()))
            return RoomFull("sessions", room.sessions, oldest.expires - now)
        owned = self._owned.get(principal)
        if room.per_principal and owned is not None and len(owned) >= room.per_principal:
            oldest = self._held[next(iter(owned))]
            return RoomFull("principal", room.per_principal, oldest.expires - now)
        return None

    async def check(self, principal: Principal, room: Room) -> None:
        if (refusal := self._refusal(principal, room, self._expire())) is not None:
            raise refusal

    async def create(self, record: SessionRecord, room: Room = NO_CAPS) -> str:
        now = self._expire()
        if record.implied:
            existing = self._implied.get(_implied_key(record))
            if existing is not None and existing in self._held:
                return existing
        if (refusal := self._refusal(record.principal, room, now)) is not None:
            raise refusal
        if record.implied:
            self._implied[_implied_key(record)] = record.id
        self._held[record.id] = _Held(record, now + self._ttl)
        if room.per_principal:
            self._owned.setdefault(record.principal, OrderedDict())[record.id] = None
        return record.id

    async def implied(self, principal: Principal, claims: str = "") -> str | None:
        self._expire()
        return self._implied.get((principal, caller_digest(claims)))

    async def load(self, session_id: str) -> SessionRecord | None:
        now = self._expire()
        held = self._held.get(session_id)
        if held is None:
            return None
        # a use: the session lives on, and moves behind every session used before it
        self._held[session_id] = _Held(held.record, now + self._ttl)
        self._held.move_to_end(session_id)
        owned = self._owned.get(held.record.principal)
        if owned is not None and session_id in owned:
            owned.move_to_end(session_id)
        return held.record

    async def records(self) -> list[SessionRecord]:
        self._expire()
        return [held.record for held in self._held.values()]

    async def save(self, records: Sequence[SessionRecord]) -> None:
        """Nothing to do: the records are the objects that changed."""

    async def swap(self, changes: Sequence[SwapChange]) -> list[int]:
        numbers = []
        for change in changes:
            record = change.record
            held = self._held.get(record.id)
            live = held is not None and held.record is record and record.ref.fingerprint != change.fingerprint
            numbers.append(record.ref.number + 1 if live else 0)
        return numbers

    async def delete(self, record: SessionRecord) -> None:
        held = self._held.get(record.id)
        if held is not None:
            self._drop(held.record)
        elif self._implied.get(key := _implied_key(record)) == record.id:
            del self._implied[key]

    async def set_backend_session(
        self, record: SessionRecord, backend_id: str, previous: str, session: BackendSession | None
    ) -> BackendSession | None:
        self._expire()
        held = self._held.get(record.id)
        if held is None:
            return None
        stored = held.record.backend_sessions
        current = stored.get(backend_id)
        if (current.session_id if current else "") == previous:
            if session is None:
                stored.pop(backend_id, None)
            else:
                stored[backend_id] = session
        return stored.get(backend_id)

    async def set_log_level(self, record: SessionRecord, level: str) -> bool:
        self._expire()
        held = self._held.get(record.id)
        if held is None:
            return False
        held.record.log_level = level
        return True

    async def subscribe(
        self, record: SessionRecord, subscription: Subscription, subscribed: bool, limit: int
    ) -> frozenset[Subscription] | None:
        self._expire()
        held = self._held.get(record.id)
        if held is None:
            return None
        kept = held.record.subscriptions
        if not subscribed:
            kept = kept - {subscription}
        elif len(kept) < limit:
            kept = kept | {subscription}
        held.record.subscriptions = kept
        return kept

    def take_expired(self) -> list[EndedSession]:
        self._expire()
        ended = list(self._ended)
        self._ended.clear()
        return ended

    async def close(self) -> None:
        """Nothing is held open."""


def _implied_key(record: SessionRecord) -> tuple[Principal, str]:
    return (record.principal, caller_digest(record.claims))
