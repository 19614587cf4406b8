"""Sessions as requests see them: stable handles whose current version is replaced whole.

A `LiveSession` holds a session's record and `current`: one `CurrentVersion` (version number +
shared index version), replaced as a whole by one reference assignment. A request reads `current`
once and uses that snapshot to the end, so a swap never mixes two versions in one answer. The
number a request sees is `current.number`; the record's `ref` is what the session store holds, and
changes only through the store's swap.

`Views` keeps the handles by id, least recently used first. With the memory state there is one per
live session, holding the very record the store keeps. With a shared state they are a cache in
front of the stored records: each request brings its session's record, which the handle takes whole
(the stored token left out), and the handle moves to the version the record names (built here from
the stored catalog when this replica does not hold it yet). Either way a handle unused for the
session time to live is dropped (its record has expired by then), oldest first.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from indexer.retrieval.allowed import Scoped, catalog_fingerprint
from indexer.retrieval.index import IndexVersion
from indexer.sessions.access import Access
from indexer.sessions.catalogs import Catalogs
from indexer.state import CatalogRef, Events, SessionRecord, StateUnavailable

logger = logging.getLogger(__name__)

VIEWS_KEPT = 100_000  # cached sessions per replica with a shared state (versions are shared anyway)
EVENT_SESSIONS = 1000  # sessions named per swap event


@dataclass(frozen=True, slots=True)
class CurrentVersion:
    """A session's index version at one moment: its number, and the shared, immutable version scoped
    to what its caller may use (`Scoped`), under the policy whose fingerprint is `policy`."""

    number: int
    scoped: Scoped
    policy: str = ""  # the policy the scope was asked of ("" without one): another in force makes it stale

    @property
    def version(self) -> IndexVersion:
        """The catalog's shared version (every tool: what the caller may use is `scoped`)."""
        return self.scoped.version

    @property
    def fingerprint(self) -> str:
        """The scoped version's: the catalog's, and the allowed set's when a policy scopes it."""
        return self.scoped.fingerprint


@dataclass(eq=False, slots=True)
class LiveSession:
    """One client session as requests see it: its record, and `current`, swapped whole."""

    record: SessionRecord  # as this replica last read it; a shared state's copy has no token
    current: CurrentVersion  # replaced, never changed in place
    used_at: float = field(default_factory=time.monotonic, repr=False)

    @property
    def id(self) -> str:
        return self.record.id


Recover = Callable[[SessionRecord], Awaitable[IndexVersion]]


class Views:
    """Sessions by id: all of them (memory state), or the recently used ones (shared state)."""

    def __init__(self, catalogs: Catalogs, shared: bool, access: Access | None = None) -> None:
        self._catalogs = catalogs
        self._shared = shared
        self.access = access or Access()  # scopes each handle's version to its caller
        self._views: OrderedDict[str, LiveSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._views)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._views

    def values(self) -> list[LiveSession]:
        return list(self._views.values())

    def remember(self, session: LiveSession) -> None:
        self._views[session.id] = session
        self._views.move_to_end(session.id)  # the order of use, which `forget_idle` relies on
        if self._shared:
            while len(self._views) > VIEWS_KEPT:
                self._views.popitem(last=False)

    def forget(self, session_id: str) -> None:
        self._views.pop(session_id, None)

    async def of(self, record: SessionRecord, recover: Recover) -> LiveSession:
        """The handle of the session a stored record describes, on the version the record names.

        `recover` gives a version when the record's catalog can no longer be read back.
        """
        view = self._views.get(record.id)
        policy = self.access.policy
        fresh = view is not None and view.current.policy == policy  # scoped under the policy in force
        if view is not None and view.record is record and fresh:  # the memory state: the store's record
            view.used_at = time.monotonic()
            self._views.move_to_end(record.id)
            return view
        if view is None or view.current.number != record.ref.number or not fresh:
            version = None
            if view is not None and view.current.number == record.ref.number:
                version = view.current.version  # the same version, asked of another policy
            if version is None:
                version = await self._catalogs.stored(
                    record.catalog, catalog_fingerprint(record.ref.fingerprint)
                )
            if version is None:
                version = await recover(record)
            # the number read after `recover`, which swaps
            current = CurrentVersion(record.ref.number, await self.access.scoped(record, version), policy)
            view = self._views.get(record.id)  # again: another request may have cached it meanwhile
            if view is None:
                view = LiveSession(record, current)
            elif view.current.number <= current.number:
                view.current = current  # the atomic publish: one reference assignment
        if self._shared:
            record.token = None  # the stored token stays in the shared state
        view.record = record
        view.used_at = time.monotonic()
        self.remember(view)
        return view

    def publish(self, session_id: str, current: CurrentVersion) -> None:
        """Move a session's handle to the version a swap gave it, unless it follows a later one."""
        view = self._views.get(session_id)
        if view is not None and view.current.number < current.number:
            view.current = current  # the atomic publish: one reference assignment

    def replace(self, rebuilt: Sequence[tuple[IndexVersion, IndexVersion]]) -> int:
        """Move the handles on each old version to its rebuild (the same tools, the same number: a
        version built while the embedder was away, now with its vectors). Returns the handles moved."""
        new_of = {id(old): new for old, new in rebuilt}
        moved = 0
        for view in self._views.values():
            now = view.current
            new = new_of.get(id(now.version))
            if new is not None:  # the same tools in the same order: the allowed set holds for it
                view.current = CurrentVersion(now.number, Scoped(new, now.scoped.allowed), now.policy)
                moved += 1
        return moved

    async def follow_swap(self, message: Mapping[str, Any]) -> None:
        """Move the cached sessions another replica swapped to the version it names (a hint)."""
        try:
            fingerprint = str(message["fingerprint"])
            refs = tuple((str(b), str(d)) for b, d in message["catalog"])
            behind = [
                (view, int(number))
                for session_id, number in message["sessions"]
                if (view := self._views.get(str(session_id))) is not None
                and view.current.number < int(number)
            ]
            if not behind:
                return
            version = await self._catalogs.stored(refs, catalog_fingerprint(fingerprint))
        except (KeyError, TypeError, ValueError):
            logger.debug("ignored a malformed swap event")
            return
        except StateUnavailable:
            return  # the sessions' next requests read their records anyway
        if version is None:
            return
        policy = self.access.policy
        for view, number in behind:
            scoped = await self.access.scoped(view.record, version)
            if view.current.number < number:
                view.current = CurrentVersion(number, scoped, policy)

    def forget_idle(self, seconds: float) -> None:
        """Drop the handles unused for `seconds` (their records have expired by then), oldest first."""
        horizon = time.monotonic() - seconds
        while self._views and next(iter(self._views.values())).used_at < horizon:
            self._views.popitem(last=False)


async def announce(
    events: Events, moved: Mapping[str, list[list[Any]]], catalogs: Mapping[str, CatalogRef]
) -> None:
    """Tell other replicas which sessions moved to which version: a hint, as they read records anyway.

    `moved` maps a fingerprint to its sessions' [id, new number] pairs.
    """
    for fingerprint, members in moved.items():
        for start in range(0, len(members), EVENT_SESSIONS):
            message = {"kind": "swapped", "fingerprint": fingerprint, "catalog": catalogs[fingerprint]}
            try:
                await events.publish({**message, "sessions": members[start : start + EVENT_SESSIONS]})
            except StateUnavailable:
                return
