"""Sessions: who they belong to, which backends they may use, and their current index version.

The session store (`indexer.state`) keeps the records: in this process (memory state) or in Redis,
shared by every replica. A version changes only through the store's swap, a compare-and-set on the
session's fingerprint that also numbers it, so numbers grow by one per swap whichever replica makes
it. Requests get a `LiveSession` (`indexer.session_views`): a handle on the record whose current
version is read once per request, so a swap never mixes two versions in one answer.

A session also keeps the backend sessions routers opened for it; ending the session hands them to
the `BackendSessionEnder` (indexer.backend_sessions), which ends them at their backends.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

from indexer.backends.backend_sessions import BackendSessionEnder
from indexer.backends.credentials import (
    authenticated,
    due_for_listing,
    kept_token,
    list_at_creation,
    list_passthrough,
    listing_token,
    record,
)
from indexer.backends.follower import HealthFollower
from indexer.backends.registry import Registry
from indexer.errors import SessionNotFound
from indexer.retrieval.index import IndexVersion, VersionPool
from indexer.sessions.catalogs import Catalog, Catalogs
from indexer.sessions.limits import SessionLimits
from indexer.sessions.views import CurrentVersion, LiveSession, Views, announce
from indexer.state import (
    BackendSession,
    EndedSession,
    Leadership,
    LocalSessions,
    Principal,
    SessionRecord,
    SessionStore,
    Shared,
    StateUnavailable,
    Swap,
    SwapChange,
    VersionRef,
)
from indexer.state.listings import intern_backends
from toolsearch.indexer_settings import Naming
from toolsearch.logs import bound

logger = logging.getLogger(__name__)

_RELIST_CONCURRENCY = 32  # passthrough listings run at once when many sessions need one


class SessionManager:
    """Opens, finds, closes and rebuilds sessions over a shared version pool and a session store."""

    def __init__(
        self,
        registry: Registry,
        pool: VersionPool,
        naming: Naming,
        max_per_principal: int = 0,
        store: SessionStore | None = None,
        shared: Shared | None = None,
        follower: HealthFollower | None = None,
        max_sessions: int = 0,
        ender: BackendSessionEnder | None = None,
        leadership: Leadership | None = None,
    ):
        self._registry = registry
        self._limits = SessionLimits(max_sessions, max_per_principal)
        self._store: SessionStore = store if store is not None else LocalSessions()
        self._shared = shared
        # only the leader rebuilds: alone always, sharing state while it holds the lease
        self._leadership = leadership or Leadership(shared.lease if shared is not None else None)
        self._catalogs = Catalogs(registry, pool, naming, shared.catalogs if shared else None)
        self._views = Views(self._catalogs, self._store.shared)
        self._warm: IndexVersion | None = None
        # with a shared state: brings the backends up to the lease holder's verdicts
        self._follower = follower
        self._ender = ender  # None: backend sessions are left to the backends' idle timeouts

    def __len__(self) -> int:
        return len(self._views)

    def sessions(self) -> list[LiveSession]:
        """The sessions this process holds: all of them (memory state), or those it served lately."""
        return self._views.values()

    async def records(self) -> list[SessionRecord]:
        """Every live session's record, wherever it was opened."""
        return await self._store.records()

    async def open(self, principal: Principal, token: str | None, implied: bool = False) -> LiveSession:
        """A new session (or, with `implied`, the principal's implied one), listed with its credentials."""
        self._views.forget_idle(self._store.ttl)
        if implied and (existing := await self._implied(principal)) is not None:
            return existing
        await self._limits.check(self._store, principal)  # before anything is listed or built for it
        token = listing_token(principal, token, implied)
        states = self._registry.states
        passthrough = [b for b, s in states.items() if s.config.auth.type == "passthrough"]
        own, epochs, rejected = await list_at_creation(self._registry, passthrough, token)
        # one shared set: 30 kB at 800 backends, and `rebuild_all` groups by it without comparing sets
        accepted = intern_backends(frozenset(states) - rejected)
        relisted = any(backend in accepted for backend in passthrough)
        catalog = self._catalogs.current(accepted, own)
        version = await self._catalogs.version(catalog)
        await self._catalogs.share([catalog])
        created = SessionRecord(
            id=secrets.token_urlsafe(24),
            principal=principal,
            token=kept_token(principal, token, relisted),
            implied=implied,
            accepted=accepted,
            rejected_at_creation=rejected,
            own_listings=own,
            ref=VersionRef(1, catalog.fingerprint),
            catalog=catalog.refs,
            listed_epochs=epochs,
        )
        created.swaps.append(Swap(None, created.ref, "created", time.time()))
        holder = await self._limits.create(self._store, created)  # other opens may have finished meanwhile
        if holder != created.id:  # another request (or replica) created the implied session first
            stored = await self._store.load(holder)
            if stored is None:
                raise StateUnavailable("an implied session was replaced while it was opened: retry")
            return await self._views.of(stored, self._recover)
        session = LiveSession(created, CurrentVersion(created.ref.number, version))
        self._views.remember(session)
        if self._follower is not None:
            await self._follower.follow_quietly()
        # A change announced while the version was built found no session to rebuild: catch up now.
        if self._catalogs.current(accepted, own).fingerprint != catalog.fingerprint:
            await self.rebuild(created, "backends changed while the session opened")
        if self._store.shared:
            created.token = None  # kept in the shared state only
        return session

    async def _implied(self, principal: Principal) -> LiveSession | None:
        session_id = await self._store.implied(principal)
        stored = await self._store.load(session_id) if session_id else None
        return await self._views.of(stored, self._recover) if stored is not None else None

    async def warm(self) -> None:
        """Build the index of every caller-independent backend, as a credential-less session would see.

        The embeddings it computes are cached, and the version is held until the next warm-up, so
        the first sessions open without embedding anything.
        """
        callers = frozenset(
            b for b, s in self._registry.states.items() if s.config.auth.type != "passthrough"
        )
        self._warm = await self._catalogs.version(self._catalogs.current(callers, {}))

    async def get(self, session_id: str, principal: Principal) -> LiveSession:
        """The session, if it lives and belongs to this principal (else: as if it did not exist)."""
        self._views.forget_idle(self._store.ttl)  # what expired unused since: nothing holds it any more
        stored = await self._store.load(session_id)
        if stored is None:
            self._views.forget(session_id)
            raise SessionNotFound(session_id)
        if stored.principal != principal:
            raise SessionNotFound(session_id)
        return await self._views.of(stored, self._recover)

    async def _recover(self, stored: SessionRecord) -> IndexVersion:
        """The version of a session whose stored catalog is gone: built from the backends now."""
        catalog = self._catalogs.current(stored.accepted, stored.own_listings)
        version = await self._catalogs.version(catalog)
        await self._catalogs.share([catalog])
        await self._swap([(stored, catalog, version)], "its stored catalog was lost")
        return version

    async def close(self, session_id: str, principal: Principal, token: str | None = None) -> None:
        """End a session at its client's request; `token` authenticates ending its backend sessions."""
        record = (await self.get(session_id, principal)).record
        await self.end(record, token or record.token)

    async def end(self, session: SessionRecord, token: str | None = None) -> None:
        """Forget a session: every later request for it answers not found; its backend sessions end."""
        await self._store.delete(session)
        self._views.forget(session.id)
        if self._ender is not None and session.backend_sessions:
            self._ender.end(EndedSession(session.id, token, dict(session.backend_sessions)))

    async def set_backend_session(
        self,
        session_id: str,
        principal: Principal,
        backend_id: str,
        previous: str,
        backend_session: BackendSession | None,
    ) -> BackendSession | None:
        """Record the session's backend session at `backend_id` if the stored one is still `previous`.

        Returns the one stored afterwards. A replaced one is not ended here: a router replaces one
        the backend answered 404 for (it forgot it), and one that loses a race ends its own.
        """
        live = await self.get(session_id, principal)
        stored = await self._store.set_backend_session(live.record, backend_id, previous, backend_session)
        if stored is None:
            live.record.backend_sessions.pop(backend_id, None)
        else:
            live.record.backend_sessions[backend_id] = stored
        return stored

    async def _relist(self, sessions: Sequence[SessionRecord]) -> list[SessionRecord]:
        """List again, with each session's stored token, the passthrough backends due for it.

        A rejection (401, or no token) from a backend that accepted the session at creation ends an
        authenticated session, so its client reconnects with fresh credentials (indexer.credentials).
        Returns the sessions whose listings changed, to store.
        """
        gate = asyncio.Semaphore(_RELIST_CONCURRENCY)
        relisted: list[SessionRecord] = []

        async def one(session: SessionRecord, due: list[str]) -> None:
            async with gate:
                attempts = await list_passthrough(self._registry, due, session.token)
            rejected = record(attempts, session.own_listings, session.listed_epochs)
            relisted.append(session)
            # a caller without an issuer has no fresh credentials to reconnect with: the backend stays out
            if authenticated(session.principal) and (rejected := rejected - session.rejected_at_creation):
                await self._end_rejected(session, rejected)

        for session in sessions:
            if session.ending:
                await self._end_rejected(session, session.ending)  # ending it failed last time
        states = self._registry.states.values()
        if not any(s.config.auth.type == "passthrough" and s.advertised for s in states):
            return relisted  # nothing to list: skip the per-session check (10,000 sessions cost ~80 ms)
        due = ((s, due_for_listing(self._registry, s.accepted, s.listed_epochs)) for s in sessions)
        await asyncio.gather(*(one(s, backends) for s, backends in due if backends and not s.ending))
        return [s for s in relisted if not s.ending]

    async def _end_rejected(self, session: SessionRecord, backends: frozenset[str]) -> None:
        """End a session whose stored credentials were rejected; a failure is retried next rebuild."""
        session.ending = backends
        if not self._store.shared and session.id not in self._views:
            return  # closed meanwhile
        try:
            await self.end(session, session.token)
        except Exception:
            # a session store can fail: the session keeps its version until the next rebuild retries
            logger.exception("ending a session whose stored credentials were rejected failed")
            return
        with bound(session=session.id):
            logger.warning(
                "ended session: backends rejected its stored credentials: %s", ", ".join(sorted(backends))
            )

    async def _swap(self, targets: Sequence[tuple[SessionRecord, Catalog, IndexVersion]], reason: str) -> int:
        """Move sessions to the versions given, through the store's compare-and-set; returns the swaps."""
        at = time.time()
        wanted = [
            (SwapChange(session, catalog.fingerprint, catalog.refs, reason, at), version)
            for session, catalog, version in targets
            if session.ref.fingerprint != catalog.fingerprint and not session.ending
        ]
        if not wanted:
            return 0
        numbers = await self._store.swap([change for change, _ in wanted])
        moved: dict[str, list[list[Any]]] = {}
        for (change, version), number in zip(wanted, numbers, strict=True):
            if number:
                # the record in hand now says what the store holds (the memory store's own record)
                swapped = change.record
                previous, swapped.ref = swapped.ref, VersionRef(number, change.fingerprint)
                swapped.catalog = change.catalog
                swapped.swaps.append(Swap(previous, swapped.ref, change.reason, change.at))
                self._views.publish(swapped.id, number, version)
                moved.setdefault(change.fingerprint, []).append([swapped.id, number])
        if self._shared is not None:
            await announce(self._shared.events, moved, {c.fingerprint: c.catalog for c, _ in wanted})
        return sum(len(members) for members in moved.values())

    async def rebuild(self, session: SessionRecord, reason: str) -> bool:
        """Give a session the version its backends call for now; returns whether it changed."""
        await self._store.save(await self._relist([session]))
        catalog = self._catalogs.current(session.accepted, session.own_listings)
        version = await self._catalogs.version(catalog)
        await self._catalogs.share([catalog])
        return await self._swap([(session, catalog, version)], reason) == 1

    async def rebuild_all(self, reason: str) -> int:
        """Rebuild every session; sessions with the same catalog share one build. Returns the swaps.

        Only the lease holder rebuilds when replicas share state. Sessions are grouped by what decides
        their catalog (usable backends, own listings): the version is looked up once per group.
        """
        if not self._leadership.leads:
            return 0
        sessions = await self._store.records()
        await self._store.save(await self._relist(sessions))
        groups: dict[tuple[frozenset[str], tuple[tuple[str, int], ...]], list[SessionRecord]] = {}
        for session in sessions:
            own = tuple((b, id(listing)) for b, listing in session.own_listings.items())
            groups.setdefault((session.accepted, own), []).append(session)
        targets: list[tuple[SessionRecord, Catalog, IndexVersion]] = []
        catalogs = []
        for members in groups.values():
            catalog = self._catalogs.current(members[0].accepted, members[0].own_listings)
            version = await self._catalogs.version(catalog)
            catalogs.append(catalog)
            targets += [(session, catalog, version) for session in members]
        await self._catalogs.share(catalogs)
        return await self._swap(targets, reason)

    async def add_backends(self, backend_ids: Sequence[str]) -> None:
        """Offer backends a config reload added to every session, listed as they would be at creation."""
        if not self._leadership.leads:
            return  # the lease holder updates the shared sessions
        states = self._registry.states
        passthrough = [b for b in backend_ids if states[b].config.auth.type == "passthrough"]
        gate = asyncio.Semaphore(_RELIST_CONCURRENCY)
        sessions = await self._store.records()

        async def offer(session: SessionRecord) -> None:
            async with gate:
                own, epochs, rejected = await list_at_creation(self._registry, passthrough, session.token)
            session.accepted = intern_backends(session.accepted | (frozenset(backend_ids) - rejected))
            session.rejected_at_creation = session.rejected_at_creation | rejected
            session.own_listings.update(own)
            session.listed_epochs.update(epochs)

        await asyncio.gather(*(offer(s) for s in sessions))
        await self._store.save(sessions)

    async def remove_backends(self, backend_ids: Sequence[str]) -> None:
        """Forget backends a config reload removed (or replaced) from every session's usable set."""
        if not self._leadership.leads:
            return
        gone = frozenset(backend_ids)
        sessions = await self._store.records()
        for session in sessions:
            session.accepted = intern_backends(session.accepted - gone)
            session.rejected_at_creation = session.rejected_at_creation - gone
            for backend_id in gone:
                session.own_listings.pop(backend_id, None)
                session.listed_epochs.pop(backend_id, None)
        await self._store.save(sessions)

    async def follow_swap(self, message: Mapping[str, Any]) -> None:
        """Take a swap another replica announced, for the sessions this one holds (a prefetch)."""
        await self._views.follow_swap(message)

    def forget_idle(self, seconds: float) -> None:
        """Drop the handles of sessions unused for `seconds` (their records have expired by then)."""
        self._views.forget_idle(seconds)
