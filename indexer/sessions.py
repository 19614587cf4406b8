"""Sessions: who they belong to, which backends they may use, and their current index version.

A session's `current` is one `Snapshot` (version number + shared index version), replaced whole by
a single assignment. A request reads it once and uses that snapshot to the end, so a swap never
mixes two versions in one answer.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from indexer.credentials import (
    ANONYMOUS,
    Principal,
    authenticated,
    due_for_listing,
    list_passthrough,
    record,
    stored_token,
)
from indexer.discovery import Listing
from indexer.errors import SessionNotFound, TooManySessions
from indexer.index import IndexVersion, VersionPool, fingerprint
from indexer.registry import Registry
from indexer.tools import Tool, advertise
from toolsearch.config import Naming
from toolsearch.logs import bound

__all__ = ["ANONYMOUS", "Principal", "Session", "SessionManager", "Snapshot", "Swap"]

logger = logging.getLogger(__name__)

SWAPS_KEPT = 8
_CATALOG_MEMO = 64
_RELIST_CONCURRENCY = 32  # passthrough listings run at once when many sessions need one


@dataclass(frozen=True, slots=True)
class _Catalog:
    listings: tuple[Listing, ...]
    tools: list[Tool]
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A session's index version at one moment."""

    number: int
    version: IndexVersion


VersionRef = tuple[int, str]  # (number, fingerprint)


@dataclass(frozen=True, slots=True)
class Swap:
    """One change of a session's version; references only, so old versions can be freed."""

    previous: VersionRef | None
    current: VersionRef
    reason: str
    at: float


def _ref(snapshot: Snapshot) -> VersionRef:
    return (snapshot.number, snapshot.version.fingerprint)


@dataclass(eq=False)
class Session:
    """One client session. `current` is swapped whole; the backend sets change only on a config reload."""

    id: str
    principal: Principal
    token: str | None = field(repr=False)  # the credentials stored at creation, for background rebuilds
    implied: bool
    accepted: frozenset[str]
    rejected_at_creation: frozenset[str]
    own_listings: dict[str, Listing]  # passthrough backends, listed with this caller's token
    current: Snapshot
    listed_epochs: dict[str, int] = field(default_factory=dict)  # passthrough backend -> epoch last listed
    # backends whose rejection of the stored credentials ends the session, while ending it has failed
    ending: frozenset[str] = frozenset()
    swaps: deque[Swap] = field(default_factory=lambda: deque(maxlen=SWAPS_KEPT))
    created_at: float = field(default_factory=time.time)


class SessionManager:
    """Opens, finds, closes and rebuilds sessions over a shared version pool."""

    def __init__(self, registry: Registry, pool: VersionPool, naming: Naming, max_per_principal: int = 0):
        self._registry = registry
        self._pool = pool
        self._naming = naming
        self._max_per_principal = max_per_principal
        self._sessions: dict[str, Session] = {}
        self._implied: dict[Principal, str] = {}
        # (backend, listing id) pairs -> catalog; the catalog keeps its listings alive so the ids stay unique
        self._catalogs: OrderedDict[tuple[tuple[str, int], ...], _Catalog] = OrderedDict()
        self._open_lock = asyncio.Lock()
        self._warm: IndexVersion | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    def _catalog(self, accepted: frozenset[str], own: dict[str, Listing]) -> _Catalog:
        """The advertised tools of a session's usable backends, memoised by the listings they come from."""
        listings: dict[str, Listing] = {}
        for backend_id in sorted(accepted):
            state = self._registry.states.get(backend_id)
            if state is None or not state.advertised:
                continue
            listing = own.get(backend_id) or state.listing
            if listing is not None:
                listings[backend_id] = listing
        key = tuple((b, id(listing)) for b, listing in listings.items())
        catalog = self._catalogs.get(key)
        if catalog is None:
            tools = advertise(
                {b: listing.tools for b, listing in listings.items()},
                prefix=self._naming.prefix,
                separator=self._naming.separator,
            )
            catalog = _Catalog(tuple(listings.values()), tools, fingerprint(tools))
            self._catalogs[key] = catalog
            if len(self._catalogs) > _CATALOG_MEMO:
                self._catalogs.popitem(last=False)
        else:
            self._catalogs.move_to_end(key)
        return catalog

    async def _version(self, accepted: frozenset[str], own: dict[str, Listing]) -> IndexVersion:
        catalog = self._catalog(accepted, own)
        return await self._pool.get(catalog.tools, catalog.fingerprint)

    async def _list_at_creation(
        self, backend_ids: Sequence[str], token: str | None
    ) -> tuple[dict[str, Listing], dict[str, int], frozenset[str]]:
        """List passthrough backends as a new session does: (listings, their epochs, rejected ones).

        A backend that refuses the token (401, 403, or no token) is rejected at creation: left out
        for the session's life. One that is down is kept, and listed once it answers again.
        """
        attempts = await list_passthrough(self._registry, backend_ids, token)
        listed = {b: a for b, a in attempts.items() if a.listing is not None}
        rejected = frozenset(b for b, a in attempts.items() if a.verdict in ("rejected", "forbidden"))
        own = {b: a.listing for b, a in listed.items() if a.listing is not None}
        return own, {b: a.epoch for b, a in listed.items()}, rejected

    async def open(self, principal: Principal, token: str | None, implied: bool = False) -> Session:
        """A new session (or, with `implied`, the principal's implied one), listed with its credentials."""
        if implied:
            existing = self._implied.get(principal)
            if existing in self._sessions:
                return self._sessions[existing]
        if self._max_per_principal and authenticated(principal):  # the others are many callers in one
            held = sum(1 for s in self._sessions.values() if s.principal == principal)
            if held >= self._max_per_principal:
                raise TooManySessions(f"this caller already holds {held} sessions: close one (DELETE /mcp)")
        token = stored_token(principal, token, implied)
        states = self._registry.states
        passthrough = [b for b, s in states.items() if s.config.auth.type == "passthrough"]
        own, epochs, rejected = await self._list_at_creation(passthrough, token)
        accepted = frozenset(states) - rejected
        version = await self._version(accepted, own)
        async with self._open_lock:
            if implied and (existing := self._implied.get(principal)) in self._sessions:
                return self._sessions[existing]  # another request created it meanwhile
            snapshot = Snapshot(number=1, version=version)
            session = Session(
                id=secrets.token_urlsafe(24),
                principal=principal,
                token=token,
                implied=implied,
                accepted=accepted,
                rejected_at_creation=rejected,
                own_listings=own,
                current=snapshot,
                listed_epochs=epochs,
            )
            session.swaps.append(Swap(None, _ref(snapshot), "created", time.time()))
            self._sessions[session.id] = session
            if implied:
                self._implied[principal] = session.id
        # A change announced while the version was built found no session to rebuild: catch up now.
        if self._catalog(accepted, own).fingerprint != version.fingerprint:
            await self.rebuild(session, "backends changed while the session opened")
        return session

    async def warm(self) -> None:
        """Build the index of every caller-independent backend, as a credential-less session would see.

        The embeddings it computes are cached, and the version is held until the next warm-up, so
        the first sessions open without embedding anything.
        """
        callers = frozenset(
            b for b, s in self._registry.states.items() if s.config.auth.type != "passthrough"
        )
        self._warm = await self._version(callers, {})

    def get(self, session_id: str, principal: Principal) -> Session:
        """The session, if it exists and belongs to this principal (else: as if it did not exist)."""
        session = self._sessions.get(session_id)
        if session is None or session.principal != principal:
            raise SessionNotFound(session_id)
        return session

    def close(self, session_id: str, principal: Principal) -> None:
        session = self.get(session_id, principal)
        self.end(session)

    def end(self, session: Session) -> None:
        """Forget a session: every later request for it answers not found."""
        self._sessions.pop(session.id, None)
        if session.implied and self._implied.get(session.principal) == session.id:
            del self._implied[session.principal]

    async def _relist(self, sessions: Sequence[Session]) -> None:
        """List again, with each session's stored token, the passthrough backends due for it.

        A rejection (401, or no token) from a backend that accepted the session at creation ends an
        authenticated session, so its client reconnects with fresh credentials (indexer.credentials).
        """
        gate = asyncio.Semaphore(_RELIST_CONCURRENCY)

        async def one(session: Session, due: list[str]) -> None:
            async with gate:
                attempts = await list_passthrough(self._registry, due, session.token)
            rejected = record(attempts, session.own_listings, session.listed_epochs)
            # a caller without an issuer has no fresh credentials to reconnect with: the backend stays out
            if authenticated(session.principal) and (rejected := rejected - session.rejected_at_creation):
                self._end_rejected(session, rejected)

        for session in sessions:
            if session.ending:
                self._end_rejected(session, session.ending)  # ending it failed last time
        states = self._registry.states.values()
        if not any(s.config.auth.type == "passthrough" and s.advertised for s in states):
            return  # nothing to list: skip the per-session check (10,000 sessions cost ~80 ms)
        due = ((s, due_for_listing(self._registry, s.accepted, s.listed_epochs)) for s in sessions)
        await asyncio.gather(*(one(s, backends) for s, backends in due if backends and not s.ending))

    def _end_rejected(self, session: Session, backends: frozenset[str]) -> None:
        """End a session whose stored credentials were rejected; a failure is retried next rebuild."""
        session.ending = backends
        if session.id not in self._sessions:
            return  # closed meanwhile
        try:
            self.end(session)
        except Exception:
            # a session store can fail: the session keeps its version until the next rebuild retries
            logger.exception("ending a session whose stored credentials were rejected failed")
            return
        with bound(session=session.id):
            logger.warning(
                "ended session: backends rejected its stored credentials: %s", ", ".join(sorted(backends))
            )

    def _swap(self, session: Session, version: IndexVersion, reason: str) -> bool:
        previous = session.current
        if version is previous.version or session.id not in self._sessions or session.ending:
            return False  # unchanged, ended, or being ended: keeps its version
        current = Snapshot(number=previous.number + 1, version=version)
        session.current = current  # the atomic publish: one reference assignment
        session.swaps.append(Swap(_ref(previous), _ref(current), reason, time.time()))
        return True

    async def rebuild(self, session: Session, reason: str) -> bool:
        """Give a session the version its backends call for now; returns whether it changed."""
        await self._relist([session])
        version = await self._version(session.accepted, session.own_listings)
        return self._swap(session, version, reason)

    async def rebuild_all(self, reason: str) -> int:
        """Rebuild every session; sessions with the same catalog share one build. Returns the swaps.

        Sessions are grouped by what decides their catalog (usable backends, own listings): the
        version is looked up once per group, and each member's swap is an assignment.
        """
        sessions = list(self._sessions.values())
        await self._relist(sessions)
        groups: dict[tuple[frozenset[str], tuple[tuple[str, int], ...]], list[Session]] = {}
        for session in sessions:
            own = tuple((b, id(listing)) for b, listing in session.own_listings.items())
            groups.setdefault((session.accepted, own), []).append(session)
        swapped = 0
        for members in groups.values():
            version = await self._version(members[0].accepted, members[0].own_listings)
            swapped += sum(self._swap(session, version, reason) for session in members)
        return swapped

    async def add_backends(self, backend_ids: Sequence[str]) -> None:
        """Offer backends a config reload added to every session, listed as they would be at creation."""
        states = self._registry.states
        passthrough = [b for b in backend_ids if states[b].config.auth.type == "passthrough"]
        gate = asyncio.Semaphore(_RELIST_CONCURRENCY)

        async def offer(session: Session) -> None:
            async with gate:
                own, epochs, rejected = await self._list_at_creation(passthrough, session.token)
            session.accepted = session.accepted | (frozenset(backend_ids) - rejected)
            session.rejected_at_creation = session.rejected_at_creation | rejected
            session.own_listings.update(own)
            session.listed_epochs.update(epochs)

        await asyncio.gather(*(offer(s) for s in list(self._sessions.values())))

    def remove_backends(self, backend_ids: Sequence[str]) -> None:
        """Forget backends a config reload removed (or replaced) from every session's usable set."""
        gone = frozenset(backend_ids)
        for session in self._sessions.values():
            session.accepted = session.accepted - gone
            session.rejected_at_creation = session.rejected_at_creation - gone
            for backend_id in gone:
                session.own_listings.pop(backend_id, None)
                session.listed_epochs.pop(backend_id, None)
