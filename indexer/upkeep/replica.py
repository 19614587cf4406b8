"""One indexer replica among several that share state through Redis: the lease, publishing, the sweep.

The replica holding the lease probes the backends and runs the rebuild passes; after each verdict it
publishes every backend's `BackendHealth` (status, listing digest, epoch...) with a new generation.
The others probe nothing: their `HealthFollower` (`indexer.follower`) adopts the published health,
which this class drives on an event and by polling the generation, since events may be lost.
Session versions need no following: every request reads its session's record, and a version a
replica does not hold yet is built from the stored catalog. When the holder dies its lease expires
and another replica takes it, catches up with the published health, and asks the fan-out for a
rebuild pass of what is stale. A backend that told a client its tools changed reaches the
holder the same way, as an event, whichever replica heard of it; and so does a new backend session,
which wakes the long polls on its session here (`indexer.sessions.backend_session_waits`).

This class takes, renews and releases the lease; whether the replica leads now is answered by the
state's `Leadership` alone, which the health monitor, the follower and the rebuilds ask too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from indexer.backends.follower import HealthFollower
from indexer.backends.registry import Registry
from indexer.sessions.manager import BACKEND_SESSIONS_EVENT, SessionManager
from indexer.sessions.versions import SessionVersions
from indexer.state import BackendHealth, Leadership, Shared, StateUnavailable
from indexer.upkeep.rebuilds import Rebuilder

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 10.0  # health is published at least this often (latencies), even when unchanged
SWEEP_SECONDS = 60.0  # the lease holder sweeps the session indexes this often (or a quarter TTL)


def _significant(health: BackendHealth) -> BackendHealth:
    """What makes a verdict worth publishing at once (latency and time alone wait for a refresh)."""
    return dataclasses.replace(health, latency=0.0, checked_at=0.0)


class Replica:
    """The lease, health publishing, events and the sweep of one replica."""

    def __init__(
        self,
        shared: Shared,
        leadership: Leadership,
        registry: Registry,
        follower: HealthFollower,
        sessions: SessionManager,
        versions: SessionVersions,
        rebuilder: Rebuilder,
        follow_interval: float,
    ) -> None:
        self._shared = shared
        self._leadership = leadership  # answers "does this replica lead?" from the lease it keeps
        self._registry = registry
        self._follower = follower
        self._sessions = sessions  # their handles are dropped when idle
        self._versions = versions  # takes the swaps other replicas announce
        self._rebuilder = rebuilder  # a new lease holder asks it for a catch-up pass
        self._follow_interval = follow_interval
        self._published: dict[str, BackendHealth] = {}  # the significant part of the last publication
        self._published_at = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._outage = follower.outage  # one log of outages for the whole replica
        self._probe_soon: Callable[[str], None] | None = None  # given by start

    async def join(self) -> None:
        """At startup, once this replica has listed the backends: take the lease, or follow its holder."""
        if await self._shared.lease.acquire():
            await self._lead(adopt=False)  # its own listings are fresher than what a past holder left
        else:
            await self._follower.follow()

    def start(self, probe_soon: Callable[[str], None] | None = None) -> None:
        """Keep the lease, listen to events, poll the health generation and sweep, until `close`.

        `probe_soon` is what takes another replica's ask for an early probe of a backend, while
        this replica leads (`HealthMonitor.probe_soon`; None when it probes nothing).
        """
        self._probe_soon = probe_soon
        for name, loop in (
            ("lease", self._keep_lease()),
            ("events", self._listen()),
            ("follow", self._every(self._follow_interval, self._follower.follow_quietly)),
            ("sweep", self._every(min(SWEEP_SECONDS, self._shared.session_ttl / 4), self._sweep)),
        ):
            self._spawn(loop, f"replica-{name}")

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop every task and hand the lease on at once (rather than after it expires)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(StateUnavailable):
            await self._shared.lease.release()

    async def publish(self, backend_id: str = "", force: bool = False) -> None:
        """Publish this replica's verdicts, if it leads and they changed (or are due for a refresh).

        The health goes as the registry holds it (a digest there always names a listing it holds);
        the listings are stored first, so a follower finds every listing the health names.
        """
        if not self._leadership.leads:
            return
        states = dict(self._registry.states)
        health = {b: state.health for b, state in states.items()}
        significant = {b: _significant(h) for b, h in health.items()}
        due = time.monotonic() - self._published_at > REFRESH_SECONDS
        if significant == self._published and not (due or force):
            return
        listings = [
            (s.health.digest, s.listing) for s in states.values() if s.listing is not None and s.health.digest
        ]
        try:
            await self._shared.catalogs.put(listings)
            generation = await self._shared.health.publish(health)
        except StateUnavailable as exc:
            self._outage.failed(exc)
            return
        self._follower.published(generation)
        self._published, self._published_at = significant, time.monotonic()
        self._outage.answered()
        await self._hint({"kind": "health", "generation": generation})

    async def _lead(self, adopt: bool = True) -> None:
        logger.info("this replica holds the lease: it probes the backends and rebuilds sessions")
        if adopt:
            await self._follower.follow(force=True)  # start from the last holder's verdicts
        await self.publish(force=True)
        # a holder that died between a verdict and its rebuild pass left sessions behind
        self._rebuilder.request("the lease changed hands: sessions catch up with the backends")

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self._shared.lease_ttl / 3)
            was = self._leadership.leads
            try:
                held = await self._shared.lease.acquire()
                if held and not was:
                    await self._lead()
            except StateUnavailable as exc:
                self._outage.failed(exc)
            else:
                self._outage.answered()
            if was and not self._leadership.leads:
                logger.warning("this replica lost the lease: another one probes the backends now")

    async def _listen(self) -> None:
        async for message in self._shared.events.listen():
            kind = message.get("kind")
            if kind == "health" and message.get("generation") != self._follower.generation:
                await self._follower.follow_quietly()
            elif kind == "swapped" and isinstance(message.get("sessions"), list):
                self._spawn(self._versions.follow_swap(message), "replica-prefetch")
            elif kind == "tools-changed" and isinstance(backend_id := message.get("backend"), str):
                self._tools_changed_here(backend_id)
            elif kind == BACKEND_SESSIONS_EVENT and isinstance(session_id := message.get("session"), str):
                self._sessions.waits.changed(session_id)  # wakes the long polls on it here

    def _tools_changed_here(self, backend_id: str) -> None:
        if self._leadership.leads and self._probe_soon is not None:
            self._probe_soon(backend_id)  # the others probe nothing

    async def tools_changed(self, backend_id: str) -> None:
        """Ask whichever replica leads (this one included) to probe a backend soon: its tools
        changed. A hint: if it is lost, the backend's next probe lists the change."""
        await self._hint({"kind": "tools-changed", "backend": backend_id})

    async def _sweep(self) -> None:
        self._sessions.forget_idle(self._shared.session_ttl)
        if not self._leadership.leads:
            return
        digests = [s.health.digest for s in self._registry.states.values() if s.listing is not None]
        try:
            dropped = await self._shared.sweep(digests)
        except StateUnavailable as exc:
            self._outage.failed(exc)
            return
        if dropped:
            logger.info("swept %d expired sessions from the shared indexes", dropped)

    async def _every(self, seconds: float, action: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            await action()

    async def _hint(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(StateUnavailable):  # a hint: followers also poll
            await self._shared.events.publish(message)
