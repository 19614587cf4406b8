"""One indexer replica among several that share state through Redis: who leads, and how others follow.

The replica holding the lease probes the backends and runs the rebuild passes; after each verdict it
publishes the backends' health (status, listing digest, epoch...) with a new generation. The others
probe nothing: they adopt the published health (on an event, and by polling the generation, since
events may be lost) so that sessions they open and the Status they report match the holder's view.
Session versions need no following: every request reads its session's record, and a version a
replica does not hold yet is built from the stored catalog. When the holder dies its lease expires
and another replica takes it, catches up with the published health, and rebuilds what is stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, get_args

from indexer.errors import StateUnavailable
from indexer.registry import Registry, Status
from indexer.sessions import SessionManager
from indexer.state import BackendRecord, Shared

__all__ = ["Replica"]

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 10.0  # health is published at least this often (latencies), even when unchanged
SWEEP_SECONDS = 60.0  # the lease holder sweeps the session indexes this often (or a quarter TTL)
STATUSES = frozenset(get_args(Status))


def _significant(record: BackendRecord) -> tuple[object, ...]:
    """What makes a verdict worth publishing at once (latency and time alone wait for a refresh)."""
    return (
        record.status,
        record.digest,
        record.epoch,
        record.protocol_version,
        record.last_error,
        record.consecutive_failures,
        record.circuit,
    )


class Replica:
    """The lease, health publishing and following, events and the sweep of one replica."""

    def __init__(
        self,
        shared: Shared,
        registry: Registry,
        sessions: SessionManager,
        catch_up: Callable[[str], None],
        follow_interval: float,
    ) -> None:
        self._shared = shared
        self._registry = registry
        self._sessions = sessions
        self._catch_up = catch_up  # requests a rebuild pass (the fan-out's coalescing entry point)
        self._follow_interval = follow_interval
        self._generation = -1  # the health generation this replica last adopted or published
        self._published: dict[str, tuple[object, ...]] = {}
        self._published_at = 0.0
        self._following = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._unavailable = False  # logged once per outage

    @property
    def leading(self) -> bool:
        """Whether this replica holds the lease now."""
        return self._shared.lease.held

    def probes(self) -> bool:
        """Whether this replica probes the backends now: only while it holds the lease."""
        return self.leading

    @staticmethod
    def alone() -> bool:
        """`probes` for an indexer that shares no state: it always probes."""
        return True

    async def join(self) -> None:
        """At startup, once this replica has listed the backends: take the lease, or follow its holder."""
        if await self._shared.lease.acquire():
            await self._lead(adopt=False)  # its own listings are fresher than what a past holder left
        else:
            await self.follow()

    def start(self) -> None:
        """Keep the lease, listen to events, poll the health generation and sweep, until `close`."""
        for name, loop in (
            ("lease", self._keep_lease()),
            ("events", self._listen()),
            ("follow", self._every(self._follow_interval, self.follow_quietly)),
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

    def _records(self) -> dict[str, BackendRecord]:
        return {
            backend_id: BackendRecord(
                status=state.status,
                digest=state.digest if state.listing is not None else "",
                epoch=state.epoch,
                protocol_version=state.protocol_version,
                latency=state.latency,
                last_error=state.last_error,
                consecutive_failures=state.consecutive_failures,
                circuit=state.circuit,
                checked_at=state.checked_at,
            )
            for backend_id, state in self._registry.states.items()
        }

    async def publish(self, backend_id: str = "", force: bool = False) -> None:
        """Publish this replica's verdicts, if it leads and they changed (or are due for a refresh)."""
        if not self.leading:
            return
        records = self._records()
        significant = {b: _significant(r) for b, r in records.items()}
        due = time.monotonic() - self._published_at > REFRESH_SECONDS
        if significant == self._published and not (due or force):
            return
        states = self._registry.states.values()
        listings = [(s.digest, s.listing) for s in states if s.listing is not None and s.digest]
        try:
            await self._shared.catalogs.put(listings)
            generation = await self._shared.health.publish(records)
        except StateUnavailable as exc:
            self._report(exc)
            return
        self._generation, self._published, self._published_at = generation, significant, time.monotonic()
        self._recovered()
        await self._hint({"kind": "health", "generation": generation})

    async def follow(self, force: bool = False) -> None:
        """Adopt the published health when its generation moved since this replica last looked."""
        async with self._following:
            if self.leading and not force:
                return
            if await self._shared.health.generation() == self._generation:
                return
            generation, records = await self._shared.health.load()
            digests = {r.digest for r in records.values() if r.digest}
            listings = await self._shared.catalogs.get(digests)
            for backend_id, record in records.items():
                state = self._registry.states.get(backend_id)
                if state is None or record.status not in STATUSES:
                    continue  # a backend this replica's configuration lacks
                if record.digest and record.digest != state.digest and record.digest in listings:
                    state.listing, state.digest = listings[record.digest], record.digest
                state.status = record.status  # type: ignore[assignment]  # checked against STATUSES
                state.epoch = record.epoch
                state.protocol_version, state.latency = record.protocol_version, record.latency
                state.last_error, state.consecutive_failures = record.last_error, record.consecutive_failures
                state.circuit, state.checked_at = record.circuit, record.checked_at
            self._generation = generation

    async def follow_quietly(self) -> None:
        """`follow`, with an unreachable state logged (once per outage) rather than raised."""
        if self.leading:
            return
        try:
            await self.follow()
        except StateUnavailable as exc:
            self._report(exc)
        else:
            self._recovered()

    async def _lead(self, adopt: bool = True) -> None:
        logger.info("this replica holds the lease: it probes the backends and rebuilds sessions")
        if adopt:
            await self.follow(force=True)  # start from the last holder's verdicts
        await self.publish(force=True)
        # a holder that died between a verdict and its rebuild pass left sessions behind
        self._catch_up("the lease changed hands: sessions catch up with the backends")

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self._shared.lease_ttl / 3)
            was = self.leading
            try:
                held = await self._shared.lease.acquire()
                if held and not was:
                    await self._lead()
            except StateUnavailable as exc:
                self._report(exc)
            else:
                self._recovered()
            if was and not self.leading:
                logger.warning("this replica lost the lease: another one probes the backends now")

    async def _listen(self) -> None:
        async for message in self._shared.events.listen():
            kind = message.get("kind")
            if kind == "health" and message.get("generation") != self._generation:
                await self.follow_quietly()
            elif kind == "swapped" and isinstance(message.get("sessions"), list):
                self._spawn(self._sessions.follow_swap(message), "replica-prefetch")

    async def _sweep(self) -> None:
        self._sessions.forget_idle(self._shared.session_ttl)
        if not self.leading:
            return
        digests = [s.digest for s in self._registry.states.values() if s.listing is not None]
        try:
            dropped = await self._shared.sweep(digests)
        except StateUnavailable as exc:
            self._report(exc)
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

    def _report(self, exc: StateUnavailable) -> None:
        if not self._unavailable:
            logger.warning("%s: retrying", exc)
        self._unavailable = True

    def _recovered(self) -> None:
        if self._unavailable:
            logger.info("shared state reachable again")
        self._unavailable = False
