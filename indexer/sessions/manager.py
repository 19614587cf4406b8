"""Sessions: who they belong to, which backends they may use, and their current index version.

The session store (`indexer.state`) keeps the records: in this process (memory state) or in Redis,
shared by every replica. A version changes only through the store's swap, a compare-and-set on the
session's fingerprint that also numbers it, so numbers grow by one per swap whichever replica makes
it. Requests get a `LiveSession` (`indexer.sessions.views`): a handle on the record whose current
version is read once per request, so a swap never mixes two versions in one answer.

`SessionManager` opens, finds and ends sessions. Moving them to new versions when their backends
change is `SessionVersions`' (`indexer.sessions.versions`), which it builds over the same store,
catalogs and handles (`versions`), and which ends a session whose credentials are rejected through
this class, the one that ends sessions.

A session also keeps the backend sessions routers opened for it; ending the session hands them to
the `BackendSessionEnder` (indexer.backend_sessions), which ends them at their backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time

from indexer.backends.backend_sessions import BackendSessionEnder
from indexer.backends.credentials import kept_token, list_at_creation, listing_token
from indexer.backends.follower import HealthFollower
from indexer.backends.lister import BackendLister
from indexer.errors import InvalidRequest, SessionNotFound
from indexer.retrieval.index import IndexVersion, VersionPool
from indexer.sessions.access import Access
from indexer.sessions.backend_session_waits import MAX_WAIT, BackendSessionWaits, stamp_of
from indexer.sessions.catalogs import Catalogs
from indexer.sessions.limits import SessionLimits
from indexer.sessions.versions import SessionVersions
from indexer.sessions.views import CurrentVersion, LiveSession, Views
from indexer.state import (
    EndedSession,
    Leadership,
    LocalSessions,
    SessionRecord,
    SessionStore,
    Shared,
    StateUnavailable,
    Swap,
)
from indexer.state.listings import intern_backends
from toolsearch.outgoing import per_caller
from toolsearch.sections.indexer_settings import Naming
from toolsearch.sessions import BackendSession, Principal, Subscription, VersionRef

BACKEND_SESSIONS_EVENT = "backend-sessions"  # the shared event: a session's backend sessions changed
MAX_SUBSCRIPTIONS = 64  # subscriptions kept per session (at backends that keep none themselves)
# a session id a router proposes: URL-safe base64 of at least 128 random bits
_PROPOSED_ID = re.compile(r"[A-Za-z0-9_-]{22,64}")


class SessionManager:
    """Opens, finds and ends sessions over a shared version pool and a session store."""

    def __init__(
        self,
        lister: BackendLister,
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
        self._lister = lister  # lists the passthrough backends with each session's credentials
        self._registry = lister.registry
        self._limits = SessionLimits(max_sessions, max_per_principal)
        self._store: SessionStore = store if store is not None else LocalSessions()
        self._pool = pool
        self._catalogs = Catalogs(self._registry, pool, naming, shared.catalogs if shared else None)
        self._views = Views(self._catalogs, self._store.shared, Access())
        self._warm: IndexVersion | None = None
        # with a shared state: brings the backends up to the leader's verdicts
        self._follower = follower
        self._ender = ender  # None: backend sessions are left to the backends' idle timeouts
        # only the leader rebuilds: alone always, sharing state while it holds the lease
        leadership = leadership or Leadership(shared.lease if shared is not None else None)
        events = shared.events if shared is not None else None
        self._events = events
        self.waits = BackendSessionWaits()  # long polls on sessions' backend sessions
        self.versions = SessionVersions(
            lister, self._catalogs, self._views, self._store, leadership, events, self.end
        )

    def __len__(self) -> int:
        return len(self._views)

    def sessions(self) -> list[LiveSession]:
        """The sessions this process holds: all of them (memory state), or those it served lately."""
        return self._views.values()

    async def records(self) -> list[SessionRecord]:
        """Every live session's record, wherever it was opened."""
        return await self._store.records()

    async def open(
        self,
        principal: Principal,
        token: str | None,
        implied: bool = False,
        session_id: str = "",
        capabilities: str = "",
        claims: str = "",
    ) -> LiveSession:
        """A new session (or, with `implied`, the principal's implied one), listed with its credentials.

        `session_id` is the id a new session takes (a router's choice, so that an open sent twice
        opens one session); when the principal already holds a session of that id, that one is the
        answer. Empty: a fresh id. `capabilities` is what the client declared at initialize (JSON),
        kept with a new session; `claims` the caller's verified claims (JSON), which the
        authorization policy reads: its version is scoped to what they may use (without a policy they
        are not kept). A principal's implied session is one per set of claims (`caller_digest`).
        """
        self._views.forget_idle(self._store.ttl)
        if self._views.access.authorizer is None:
            claims = ""  # only a policy reads them: without one, not kept (nor telling sessions apart)
        if implied and (existing := await self._implied(principal, claims)) is not None:
            return existing
        if session_id and not implied and (existing := await self._proposed(principal, session_id)):
            return existing
        await self._limits.check(self._store, principal)  # before anything is listed or built for it
        token = listing_token(principal, token, implied)
        states = self._registry.states
        passthrough = [b for b, s in states.items() if per_caller(s.config.auth)]
        own, epochs, rejected = await list_at_creation(self._lister, passthrough, token, principal)
        # one shared set: 30 kB at 800 backends, and `rebuild_all` groups by it without comparing sets
        accepted = intern_backends(frozenset(states) - rejected)
        relisted = any(backend in accepted for backend in passthrough)
        catalog = self._catalogs.current(accepted, own)
        version = await self._catalogs.version(catalog)
        await self._catalogs.share([catalog])
        created = SessionRecord(
            id=session_id if session_id and not implied else secrets.token_urlsafe(24),
            principal=principal,
            token=kept_token(principal, token, relisted),
            implied=implied,
            accepted=accepted,
            rejected_at_creation=rejected,
            own_listings=own,
            ref=VersionRef(1, catalog.fingerprint),
            catalog=catalog.refs,
            listed_epochs=epochs,
            client_capabilities="" if implied else capabilities,
            claims=claims,
        )
        policy = self._views.access.policy
        scoped = await self._views.access.scoped(created, version)
        created.ref = VersionRef(1, scoped.fingerprint)
        created.swaps.append(Swap(None, created.ref, "created", time.time()))
        holder = await self._limits.create(self._store, created)  # other opens may have finished meanwhile
        if holder != created.id:  # another request (or replica) created the implied session first
            stored = await self._store.load(holder)
            if stored is None:
                raise StateUnavailable("an implied session was replaced while it was opened: retry")
            return await self._views.of(stored, self._recover)
        session = LiveSession(created, CurrentVersion(created.ref.number, scoped, policy))
        self._views.remember(session)
        if self._follower is not None:
            await self._follower.follow_quietly()
        # A change announced while the version was built found no session to rebuild: catch up now.
        if self._catalogs.current(accepted, own).fingerprint != catalog.fingerprint:
            await self.versions.rebuild(created, "backends changed while the session opened")
        if self._store.shared:
            created.token = None  # kept in the shared state only
        return session

    async def _proposed(self, principal: Principal, session_id: str) -> LiveSession | None:
        """The principal's session of a proposed id, when an earlier attempt of the open made it."""
        if not _PROPOSED_ID.fullmatch(session_id):
            raise InvalidRequest(
                "session_id must be 22 to 64 characters of A-Z, a-z, 0-9, '-' and '_' (random: "
                "at least 128 bits), or empty for the indexer to choose"
            )
        stored = await self._store.load(session_id)
        if stored is None:
            return None
        if stored.principal != principal:
            raise InvalidRequest("session_id is taken: propose another (a fresh random one)")
        return await self._views.of(stored, self._recover)

    async def _implied(self, principal: Principal, claims: str) -> LiveSession | None:
        session_id = await self._store.implied(principal, claims)
        stored = await self._store.load(session_id) if session_id else None
        return await self._views.of(stored, self._recover) if stored is not None else None

    async def warm(self) -> None:
        """Build the index of every caller-independent backend, as a credential-less session would see.

        The embeddings it computes are cached, and the version is held until the next warm-up, so
        the first sessions open without embedding anything.
        """
        callers = frozenset(b for b, s in self._registry.states.items() if not per_caller(s.config.auth))
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
        await self.versions.swap([(stored, catalog, version)], "its stored catalog was lost")
        return version

    async def close(self, session_id: str, principal: Principal, token: str | None = None) -> None:
        """End a session at its client's request; `token` authenticates ending its backend sessions."""
        record = (await self.get(session_id, principal)).record
        await self.end(record, token or record.token)

    async def end(self, session: SessionRecord, token: str | None = None) -> None:
        """Forget a session: every later request for it answers not found; its backend sessions end."""
        await self._store.delete(session)
        self._views.forget(session.id)
        await self.backend_sessions_changed(session.id)  # a long poll on it hears the end at once
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
        await self.backend_sessions_changed(session_id)
        return stored

    async def backend_sessions(
        self, session_id: str, principal: Principal, seen: str = "", wait: float = 0.0
    ) -> LiveSession:
        """The session, for its backend sessions; when `seen` is their stamp (`stamp_of`), once they
        change or after `wait` seconds (at most `MAX_WAIT`), whichever comes first."""
        with self.waits.watching(session_id) as change:
            live = await self.get(session_id, principal)
            if change is None or not seen or seen != stamp_of(live.record):
                return live
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(change.wait(), min(wait, MAX_WAIT))
        return await self.get(session_id, principal)

    async def backend_sessions_changed(self, session_id: str) -> None:
        """Wake the long polls on the session's backend sessions, on every replica."""
        self.waits.changed(session_id)
        if self._events is not None:
            with contextlib.suppress(StateUnavailable):  # a hint: a waiter reads the set at its end
                await self._events.publish({"kind": BACKEND_SESSIONS_EVENT, "session": session_id})

    async def set_log_level(self, session_id: str, principal: Principal, level: str) -> LiveSession:
        """Keep the log level the session's client set; the session, with its backend sessions."""
        live = await self.get(session_id, principal)
        if not await self._store.set_log_level(live.record, level):
            raise SessionNotFound(session_id)
        live.record.log_level = level
        return live

    async def subscribe(
        self, session_id: str, principal: Principal, subscription: Subscription, subscribed: bool
    ) -> None:
        """Keep (or drop) a subscription of the session's client, and wake the long polls on the
        session, on every replica, so the one holding its standalone stream follows it. Raises
        `InvalidRequest` for a subscription beyond `MAX_SUBSCRIPTIONS`."""
        live = await self.get(session_id, principal)
        kept = await self._store.subscribe(live.record, subscription, subscribed, MAX_SUBSCRIPTIONS)
        if kept is None:
            raise SessionNotFound(session_id)
        live.record.subscriptions = kept
        if subscribed and subscription not in kept:
            raise InvalidRequest(
                f"a session keeps at most {MAX_SUBSCRIPTIONS} subscriptions: unsubscribe from one first"
            )
        await self.backend_sessions_changed(session_id)

    async def complete_versions(self) -> int:
        """Build again with their vectors the versions built while the embedder was away, and move the
        sessions on them to the rebuilds (same tools, same numbers). Returns the sessions moved."""
        rebuilt = await self._pool.complete()
        for old, new in rebuilt:
            if self._warm is old:
                self._warm = new
        return self._views.replace(rebuilt)

    @property
    def access(self) -> Access:
        """What sessions' callers may use, under the policy in force."""
        return self._views.access

    def forget_idle(self, seconds: float) -> None:
        """Drop the handles of sessions unused for `seconds` (their records have expired by then)."""
        self._views.forget_idle(seconds)
