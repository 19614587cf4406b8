"""Session versions: each session moved to the index version its backends call for now.

A change to what sessions may see (a backend crossing the advertised line, a tool list changing, a
config reload, an authorization policy that decides differently) reaches `SessionVersions` through
the fan-out (`indexer.upkeep.rebuilds`), which runs `rebuild_all`. A pass lists the passthrough
backends due for each session again with its stored token, finds each session's catalog now, scopes
its version to what its caller may use under the policy in force (`Access`: the scoped fingerprint
names the allowed set too), and swaps the session through the store's compare-and-set on that
fingerprint, which also numbers the version; sessions whose scoped version did not change keep
theirs. With replicas sharing state only the leader (`indexer.state.Leadership`) rebuilds, and the
swaps are announced so that the others can fetch the new versions early (`follow_swap`).

The sessions themselves (opening, finding, ending them) stay with the `SessionManager`, which builds
this class over the same store, catalogs and handles and asks it to rebuild one session it opened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from indexer.backends.credentials import (
    authenticated,
    due_for_listing,
    list_at_creation,
    list_per_caller,
    listable,
    record,
)
from indexer.backends.lister import BackendLister
from indexer.retrieval.index import IndexVersion
from indexer.sessions.catalogs import Catalog, Catalogs
from indexer.sessions.views import CurrentVersion, Views, announce
from indexer.state import Events, Leadership, SessionRecord, SessionStore, Swap, SwapChange
from indexer.state.listings import intern_backends
from toolsearch.logs import bound
from toolsearch.outgoing import per_caller
from toolsearch.sessions import VersionRef

logger = logging.getLogger(__name__)

_RELIST_CONCURRENCY = 32  # passthrough listings run at once when many sessions need one

# Ends a session (its record, its handle, its backend sessions): the `SessionManager`'s `end`, which
# owns ending; a session whose stored credentials a backend rejects is ended through it.
End = Callable[[SessionRecord, str | None], Awaitable[None]]
# A session, the catalog it has now, and the version built from it: what a swap moves it to
NewVersion = tuple[SessionRecord, Catalog, IndexVersion]


class SessionVersions:
    """Rebuilds sessions' versions after changes and swaps them through the session store."""

    def __init__(
        self,
        lister: BackendLister,
        catalogs: Catalogs,
        views: Views,
        store: SessionStore,
        leadership: Leadership,
        events: Events | None,
        end: End,
    ) -> None:
        self._lister = lister  # lists the passthrough backends with each session's credentials
        self._registry = lister.registry
        self._catalogs = catalogs
        self._views = views  # the handles requests hold: a swap publishes its version to them
        self._store = store
        self._leadership = leadership  # only the leader rebuilds the shared sessions
        self._events = events  # with a shared state: swaps announced to the other replicas
        self._end = end

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
                attempts = await list_per_caller(self._lister, due, session.token, session.principal)
            rejected = record(attempts, session.own_listings, session.listed_epochs)
            relisted.append(session)
            # a caller without an issuer has no fresh credentials to reconnect with: the backend stays out
            if authenticated(session.principal) and (rejected := rejected - session.rejected_at_creation):
                await self._end_rejected(session, rejected)

        for session in sessions:
            if session.ending:
                await self._end_rejected(session, session.ending)  # ending it failed last time
        candidates = listable(self._registry)
        if not candidates:
            return relisted  # nothing to list
        due = ((s, due_for_listing(candidates, s.accepted, s.listed_epochs)) for s in sessions)
        await asyncio.gather(*(one(s, backends) for s, backends in due if backends and not s.ending))
        return [s for s in relisted if not s.ending]

    async def _end_rejected(self, session: SessionRecord, backends: frozenset[str]) -> None:
        """End a session whose stored credentials were rejected; a failure is retried next rebuild."""
        session.ending = backends
        if not self._store.shared and session.id not in self._views:
            return  # closed meanwhile
        try:
            await self._end(session, session.token)
        except Exception:
            # a session store can fail: the session keeps its version until the next rebuild retries
            logger.exception("ending a session whose stored credentials were rejected failed")
            return
        with bound(session=session.id):
            logger.warning(
                "ended session: backends rejected its stored credentials: %s", ", ".join(sorted(backends))
            )

    async def swap(self, new_versions: Sequence[NewVersion], reason: str) -> int:
        """Move sessions to the versions given, through the store's compare-and-set; returns the swaps."""
        at = time.time()
        access = self._views.access
        policy = access.policy  # read before the policy is asked: a newer one in force makes these stale
        # lists of what exists already: a pass over ten thousand sessions makes no object per session
        # here, so it adds nothing for the garbage collector to walk
        live = [change for change in new_versions if not change[0].ending]
        scopes = await access.scoped_all([change[0] for change in live], [change[2] for change in live])
        wanted = [
            (SwapChange(session, scoped.fingerprint, catalog.refs, reason, at), scoped)
            for (session, catalog, _), scoped in zip(live, scopes, strict=True)
            if session.ref.fingerprint != scoped.fingerprint
        ]
        if not wanted:
            return 0
        numbers = await self._store.swap([change for change, _ in wanted])
        moved: dict[str, list[list[Any]]] = {}
        for (change, scoped), number in zip(wanted, numbers, strict=True):
            if number:
                # the record in hand now says what the store holds (the memory store's own record)
                swapped = change.record
                previous, swapped.ref = swapped.ref, VersionRef(number, change.fingerprint)
                swapped.catalog = change.catalog
                swapped.swaps.append(Swap(previous, swapped.ref, change.reason, change.at))
                self._views.publish(swapped.id, CurrentVersion(number, scoped, policy))
                moved.setdefault(change.fingerprint, []).append([swapped.id, number])
        if self._events is not None:
            await announce(self._events, moved, {c.fingerprint: c.catalog for c, _ in wanted})
        return sum(len(members) for members in moved.values())

    async def rebuild(self, session: SessionRecord, reason: str) -> bool:
        """Give a session the version its backends call for now; returns whether it changed."""
        await self._store.save(await self._relist([session]))
        catalog = self._catalogs.current(session.accepted, session.own_listings)
        version = await self._catalogs.version(catalog)
        await self._catalogs.share([catalog])
        return await self.swap([(session, catalog, version)], reason) == 1

    async def rebuild_all(self, reason: str) -> int:
        """Rebuild every session; sessions with the same catalog share one build. Returns the swaps.

        Only the leader rebuilds when replicas share state. Sessions are grouped by what decides
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
        new_versions: list[NewVersion] = []
        catalogs = []
        for members in groups.values():
            catalog = self._catalogs.current(members[0].accepted, members[0].own_listings)
            version = await self._catalogs.version(catalog)
            catalogs.append(catalog)
            new_versions += [(session, catalog, version) for session in members]
        await self._catalogs.share(catalogs)
        return await self.swap(new_versions, reason)

    async def add_backends(self, backend_ids: Sequence[str]) -> None:
        """Offer backends a config reload added to every session, listed as they would be at creation."""
        if not self._leadership.leads:
            return  # the leader updates the shared sessions
        states = self._registry.states
        passthrough = [b for b in backend_ids if per_caller(states[b].config.auth)]
        gate = asyncio.Semaphore(_RELIST_CONCURRENCY)
        sessions = await self._store.records()

        async def offer(session: SessionRecord) -> None:
            async with gate:
                own, epochs, rejected = await list_at_creation(
                    self._lister, passthrough, session.token, session.principal
                )
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
