"""Config reload: the backends a changed configuration file adds, removes or changes, applied live.

`toolsearch indexer` rereads its file on SIGHUP. Only the backend list takes effect without a
restart (listen addresses, the model and the other settings are read once at start). Sessions stay
connected: each gains the added backends (passthrough ones listed with its stored token, as at
creation), loses the removed ones, and gets a new index version through the usual fan-out
(`Rebuilder.request`, as for a health change).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from indexer.backends.lister import BackendLister
from indexer.sessions.versions import SessionVersions
from indexer.upkeep.health import HealthMonitor
from indexer.upkeep.rebuilds import Rebuilder
from toolsearch.sections.backend_settings import Backend

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendChanges:
    """What a reload changes in the backend list."""

    added: tuple[Backend, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[Backend, ...] = ()  # same id, another URL, auth or timeout: replaced

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def reason(self) -> str:
        """The swap reason sessions record, e.g. "config reload: added weather; removed news"."""
        parts = [
            f"{verb} {', '.join(ids)}"
            for verb, ids in (
                ("added", [b.id for b in self.added]),
                ("removed", list(self.removed)),
                ("changed", [b.id for b in self.changed]),
            )
            if ids
        ]
        return "config reload: " + "; ".join(parts)


def backend_changes(current: Sequence[Backend], wanted: Sequence[Backend]) -> BackendChanges:
    """The difference between the running backend list and a reloaded one."""
    now = {b.id: b for b in current}
    new = {b.id: b for b in wanted}
    return BackendChanges(
        added=tuple(b for b in wanted if b.id not in now),
        removed=tuple(b for b in now if b not in new),
        changed=tuple(b for b in wanted if b.id in now and now[b.id] != b),
    )


async def apply_changes(
    changes: BackendChanges,
    lister: BackendLister,
    versions: SessionVersions,
    monitor: HealthMonitor | None,
    rebuilder: Rebuilder,
) -> None:
    """Apply backend changes to the registry, the sessions and the monitor, then rebuild for them."""
    if not changes:
        return
    registry = lister.registry
    gone = [*changes.removed, *(b.id for b in changes.changed)]
    fresh = [*changes.added, *changes.changed]
    for backend_id in gone:
        if monitor is not None:
            await monitor.untrack(backend_id)
        registry.remove(backend_id)
    await versions.remove_backends(gone)
    for backend in fresh:
        registry.add(backend)
    # First listing of each new backend, as at startup: one that fails is left out until it recovers.
    await asyncio.gather(*(lister.discover(b.id) for b in fresh))
    await versions.add_backends([b.id for b in fresh])
    if monitor is not None:
        for backend in fresh:
            monitor.track(backend.id)
    reason = changes.reason()
    logger.info("%s", reason)
    rebuilder.request(reason)
