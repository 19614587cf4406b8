"""Following the leader: a replica that does not probe adopts the health the leader publishes.

Replicas sharing state judge the backends once, on the leader (the lease holder, `indexer.replica`),
which publishes every backend's `BackendHealth` with a new generation. `HealthFollower` brings this
replica's registry up to the latest generation: on an event, by polling (events may be lost), and
before a new session's catalog is checked (`SessionManager.open`), so that sessions opened here and
the statuses reported here match the leader's view. Whether this replica leads, and so has nothing
to adopt, is the state's `Leadership`'s answer. It is built before the `SessionManager`, which it
serves, and the `Replica` (built after the sessions) drives it and logs through its `OutageLog`.
"""

from __future__ import annotations

import asyncio
import logging

from indexer.backends.registry import Registry
from indexer.state import Leadership, Shared, StateUnavailable

logger = logging.getLogger(__name__)


class OutageLog:
    """Logs an unreachable shared state once per outage, and once when it answers again."""

    def __init__(self) -> None:
        self._down = False

    def failed(self, exc: StateUnavailable) -> None:
        if not self._down:
            logger.warning("%s: retrying", exc)
        self._down = True

    def answered(self) -> None:
        if self._down:
            logger.info("shared state reachable again")
        self._down = False


class HealthFollower:
    """Adopts the published health into the registry when its generation moved."""

    def __init__(self, shared: Shared, registry: Registry, leadership: Leadership) -> None:
        self._shared = shared
        self._registry = registry
        self._leadership = leadership  # the leader publishes the health: it has nothing to adopt
        self.generation = -1  # the health generation this replica last adopted or published
        self._following = asyncio.Lock()
        self.outage = OutageLog()  # one per replica: its other loops report through it too

    def published(self, generation: int) -> None:
        """Note this replica's own publication: there is nothing to adopt up to that generation."""
        self.generation = generation

    async def follow(self, force: bool = False) -> None:
        """Adopt the published health, unless this replica leads (`force`: even then)."""
        async with self._following:
            if self._leadership.leads and not force:
                return
            if await self._shared.health.generation() == self.generation:
                return
            generation, published = await self._shared.health.load()
            digests = {health.digest for health in published.values() if health.digest}
            listings = await self._shared.catalogs.get(digests)
            for backend_id, health in published.items():
                state = self._registry.states.get(backend_id)
                if state is None:
                    continue  # a backend this replica's configuration lacks
                # a listing only for a digest this replica does not hold: an unchanged list keeps
                # its object, which session catalogs are memoised by
                fresh = bool(health.digest) and health.digest != state.health.digest
                self._registry.adopt(backend_id, health, listings.get(health.digest) if fresh else None)
            self.generation = generation

    async def follow_quietly(self) -> None:
        """`follow`, with an unreachable state logged (once per outage) rather than raised."""
        if self._leadership.leads:
            return
        try:
            await self.follow()
        except StateUnavailable as exc:
            self.outage.failed(exc)
        else:
            self.outage.answered()
