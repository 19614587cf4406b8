"""The sessions one indexer holds in memory, each with its current index version, swapped whole.

A `Session` is a session's record plus `current`: one `Snapshot` (version number + shared index
version), replaced whole by a single assignment. A request reads it once and uses that snapshot to
the end, so a swap never mixes two versions in one answer.

With the memory state these objects are the sessions themselves. With a shared state they are a
cache in front of the records: each request brings its session's record, and the cached object is
refreshed from it, taking the version the record names (built here from the stored catalog when
this replica does not hold it yet). The stored token is not kept in this cache.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from indexer.catalogs import Catalogs
from indexer.errors import StateUnavailable
from indexer.index import IndexVersion
from indexer.state import CatalogRef, Events, SessionRecord, Swap, SwapChange

__all__ = ["Session", "Snapshot", "Views", "announce"]

logger = logging.getLogger(__name__)

VIEWS_KEPT = 100_000  # cached sessions per replica with a shared state (versions are shared anyway)
EVENT_SESSIONS = 1000  # sessions named per swap event
_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(SessionRecord))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A session's index version at one moment."""

    number: int
    version: IndexVersion


@dataclass(eq=False)
class Session(SessionRecord):
    """One client session as requests see it. `current` is swapped whole, together with `ref`."""

    current: Snapshot = field(kw_only=True)
    used_at: float = field(default_factory=time.monotonic, kw_only=True, repr=False)


Recover = Callable[[SessionRecord], Awaitable[IndexVersion]]


class Views:
    """Sessions by id: all of them (memory state), or the recently used ones (shared state)."""

    def __init__(self, catalogs: Catalogs, shared: bool) -> None:
        self._catalogs = catalogs
        self._shared = shared
        self._views: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._views)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._views

    def values(self) -> list[Session]:
        return list(self._views.values())

    def remember(self, session: Session) -> None:
        self._views[session.id] = session
        if self._shared:
            self._views.move_to_end(session.id)
            while len(self._views) > VIEWS_KEPT:
                self._views.popitem(last=False)

    def forget(self, session_id: str) -> None:
        self._views.pop(session_id, None)

    async def of(self, record: SessionRecord, recover: Recover) -> Session:
        """The session a stored record describes, on the version the record names.

        `recover` gives a version when the record's catalog can no longer be read back.
        """
        if isinstance(record, Session):
            return record  # the memory state hands out the objects themselves
        view = self._views.get(record.id)
        if view is None or view.ref != record.ref:
            version = await self._catalogs.stored(record.catalog, record.ref[1])
            if version is None:
                version = await recover(record)
            fields = {name: getattr(record, name) for name in _RECORD_FIELDS}
            view = Session(**fields, current=Snapshot(record.ref[0], version))
        else:
            for name in ("accepted", "rejected_at_creation", "own_listings", "listed_epochs", "swaps"):
                setattr(view, name, getattr(record, name))
        view.token = None  # the stored token stays in the shared state
        view.used_at = time.monotonic()
        self.remember(view)
        return view

    def publish(self, change: SwapChange, number: int, version: IndexVersion) -> None:
        """Record a swap the state accepted, and move the session's object to the new version."""
        record = change.record
        previous = record.ref
        record.ref, record.catalog = (number, change.fingerprint), change.catalog
        record.swaps.append(Swap(previous, record.ref, change.reason, change.at))
        view = record if isinstance(record, Session) else self._views.get(record.id)
        if view is None:
            return
        if view is not record:
            if view.ref[0] >= number:
                return  # it already follows a later swap
            view.ref, view.catalog = record.ref, record.catalog
            view.swaps.append(record.swaps[-1])
        view.current = Snapshot(number, version)  # the atomic publish: one reference assignment

    async def follow_swap(self, message: Mapping[str, Any]) -> None:
        """Move the cached sessions another replica swapped to the version it names (a hint)."""
        try:
            fingerprint = str(message["fingerprint"])
            refs = tuple((str(b), str(d)) for b, d in message["catalog"])
            behind = [
                (view, int(number))
                for session_id, number in message["sessions"]
                if (view := self._views.get(str(session_id))) is not None and view.ref[0] < int(number)
            ]
            if not behind:
                return
            version = await self._catalogs.stored(refs, fingerprint)
        except (KeyError, TypeError, ValueError):
            logger.debug("ignored a malformed swap event")
            return
        except StateUnavailable:
            return  # the sessions' next requests read their records anyway
        if version is None:
            return
        for view, number in behind:
            if view.ref[0] < number:
                view.ref, view.catalog = (number, fingerprint), refs
                view.current = Snapshot(number, version)

    def forget_idle(self, seconds: float) -> None:
        """Drop cached sessions unused for `seconds` (their records expire by then); shared state only."""
        if not self._shared:
            return
        horizon = time.monotonic() - seconds
        for session_id in [s.id for s in self._views.values() if s.used_at < horizon]:
            del self._views[session_id]


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
