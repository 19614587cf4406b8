"""Backend health: each backend probed on an interval, its status judged from the outcomes.

A probe is what discovery does (MCP `initialize` + `tools/list`), bounded by the health timeout;
at most `max_concurrent_probes` run at once, and a probe's timeout starts once it holds a slot.
`HealthMonitor` runs one probe loop per backend, has the `BackendLister` probe it, judges the
outcome (indexer/upkeep/verdicts.py: `judge`, the circuit breaker) and records each verdict in the
`Registry`. When what sessions may see
changes (a backend crossing the advertised line, or an advertised backend's tool list changing) it
asks the `Rebuilder` (indexer/upkeep/rebuilds.py) for a rebuild pass, which gives the sessions their
new index versions. A backend that tells a client its tools changed is probed at once
(`probe_soon`), beside its cadence. With replicas sharing state, only the lease holder probes, and
its `Replica` publishes each verdict for the others to adopt (and hands it the asks for an early
probe that other replicas got). docs/health.md describes the statuses and transitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

from indexer.backends.lister import BackendLister
from indexer.errors import BackendError, BackendRejected, BackendUnavailable
from indexer.state import Leadership
from indexer.state.listings import Listing
from indexer.upkeep.rebuilds import Rebuilder
from indexer.upkeep.replica import Replica
from indexer.upkeep.verdicts import CircuitBreaker, Clock, Outcome, answer_reason, change_reason, judge
from toolsearch.outgoing import per_caller
from toolsearch.sections.backend_settings import Backend
from toolsearch.sections.indexer_settings import Health

logger = logging.getLogger(__name__)

Probe = Callable[[Backend, float], Awaitable[Listing]]

# The listing's own deadline ends a probe; this later one only stops a probe that ignores it, so a
# hanging backend never stalls its loop. Two deadlines at the same instant would race inside the SDK.
_GUARD_SLACK = 1.0
EARLY_GAP = 1.0  # seconds at least between two probes of one backend asked for by probe_soon


class HealthMonitor:
    """One probe loop per backend, concurrent and independent: a hanging backend stalls only itself."""

    def __init__(
        self,
        lister: BackendLister,
        settings: Health,
        rebuilder: Rebuilder,
        replica: Replica | None = None,
        leadership: Leadership | None = None,
        probe: Probe | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._lister = lister  # probes the backends, and keeps their probe clients
        self._registry = lister.registry  # where each verdict is recorded
        self._settings = settings
        self._rebuilder = rebuilder  # told when what sessions may see changed
        # With replicas sharing state: only the leader probes, and its replica publishes each
        # verdict for the others to adopt. Without them (None) an indexer alone always leads.
        self._replica = replica
        self._leadership = leadership or Leadership()
        self._probe: Probe = probe or lister.probe
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stops: dict[str, asyncio.Event] = {}
        self._wakes: dict[str, asyncio.Event] = {}  # set to end a loop's wait: stopped, or probe_soon
        # Probes in flight, over all backends: hundreds at once would take the event loop from the
        # requests being served, and wait for the shared connection pool.
        self._slots = asyncio.Semaphore(settings.max_concurrent_probes)
        self._queued: set[asyncio.Task[object]] = set()  # tasks waiting for a slot
        self.probes = 0

    @property
    def tracked(self) -> list[str]:
        """The backends with a running probe loop."""
        return [b for b, task in self._tasks.items() if not task.done()]

    @property
    def queued(self) -> int:
        """How many probes wait for a slot now."""
        return len(self._queued)

    def start(self) -> None:
        """Start a probe loop for every backend of the registry."""
        for backend_id in self._registry.states:
            self.track(backend_id)

    def track(self, backend_id: str) -> None:
        """Start probing one backend (a no-op when it is already probed)."""
        if backend_id in self.tracked:
            return
        breaker = self._settings.circuit_breaker
        if breaker.enabled:
            self._breakers[backend_id] = CircuitBreaker(breaker.cooldown, self._clock)
            self._registry.set_circuit(backend_id, "closed")
        stop = self._stops[backend_id] = asyncio.Event()
        wake = self._wakes[backend_id] = asyncio.Event()
        self._tasks[backend_id] = asyncio.get_running_loop().create_task(
            self._loop(backend_id, stop, wake), name=f"health-probe:{backend_id}"
        )

    async def untrack(self, backend_id: str) -> None:
        """Stop probing one backend, wait until its loop has ended, and close its probe client."""
        self._breakers.pop(backend_id, None)
        task = self._tasks.pop(backend_id, None)
        stop = self._stops.pop(backend_id, None)
        wake = self._wakes.pop(backend_id, None)
        if task is not None and stop is not None:
            stop.set()
            if wake is not None:
                wake.set()
            if task in self._queued:
                task.cancel()  # still waiting for a slot: no exchange has begun, so it can end now
            # A probe in flight is let finish (its timeout bounds it): cancelling the MCP client
            # half-way through an exchange can leave the SDK's own tasks waiting forever.
            done, _ = await asyncio.wait({task}, timeout=self._settings.timeout + 2 * _GUARD_SLACK)
            if not done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._lister.close_probe_client(backend_id)

    async def close(self) -> None:
        """Stop every probe loop, all at once, and close every probe client."""
        await asyncio.gather(*(self.untrack(backend_id) for backend_id in list(self._tasks)))
        await self._lister.close_probe_clients()

    def probe_soon(self, backend_id: str) -> None:
        """Probe one backend now rather than at its next turn (it said its tools changed).

        Asks coalesce: however many come while one waits, the backend is probed once, and at most
        once per `EARLY_GAP` seconds beside its own cadence, which this leaves as it was.
        """
        wake = self._wakes.get(backend_id)
        if wake is not None:
            wake.set()

    async def _loop(self, backend_id: str, stop: asyncio.Event, wake: asyncio.Event) -> None:
        # A fixed cadence rather than a pause after each probe, so a slow probe does not stretch it.
        loop = asyncio.get_running_loop()
        interval = self._settings.interval
        # Each backend keeps its own phase within the interval, so hundreds of backends are not
        # probed in one burst that starves the requests the indexer is serving.
        phase = zlib.crc32(backend_id.encode()) / 2**32
        due = loop.time() + interval * (1 + phase)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), max(0.0, due - loop.time()))
            if stop.is_set():
                return
            early = wake.is_set()
            if early:
                wake.clear()  # asked for now: its turns stay where they were
            else:
                due = max(due + interval, loop.time())
            if not self._leadership.leads:
                continue  # another replica probes; this one adopts its verdicts
            breaker = self._breakers.get(backend_id)
            if breaker is not None and not breaker.allow():
                continue
            try:
                await self.check(backend_id)
                if self._replica is not None:
                    await self._replica.publish(backend_id)
            except Exception:
                # a bug in one verdict must not end monitoring of this backend
                logger.exception("health probe of %s failed unexpectedly", backend_id)
            if early:  # a backend that keeps saying its tools changed is listed once a gap at most
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), EARLY_GAP)

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """Hold one of the probe slots; while waiting, `untrack` may cancel the task at once."""
        task = asyncio.current_task()
        assert task is not None
        self._queued.add(task)
        try:
            await self._slots.acquire()
        finally:
            self._queued.discard(task)
        try:
            yield
        finally:
            self._slots.release()

    async def _outcome(self, backend: Backend) -> tuple[Outcome, Listing | None, BackendError | None]:
        timeout = min(self._settings.timeout, backend.timeout)
        try:
            async with asyncio.timeout(timeout + _GUARD_SLACK):
                listing = await self._probe(backend, timeout)
        except BackendRejected as exc:
            # Per-caller backends are probed without a caller's token: refusing it means alive.
            if per_caller(backend.auth):
                return "ok", None, None
            return "rejected", None, exc
        except BackendError as exc:
            return "failed", None, exc
        except TimeoutError:
            return "failed", None, BackendUnavailable(backend.id, f"no answer within {timeout:g}s")
        return "ok", listing, None

    async def check(self, backend_id: str) -> str | None:
        """Probe one backend once a slot is free and record the verdict; returns the reason announced, if any.

        Neither the timeout nor the latency counts the wait for a slot: waiting is not the backend's doing.
        """
        probed = self._registry.states.get(backend_id)
        if probed is None:
            return None
        backend = probed.config
        async with self._slot():
            started = time.perf_counter()
            outcome, listing, error = await self._outcome(backend)
            latency = time.perf_counter() - started
        self.probes += 1
        # judged against the state now: other verdicts may have been recorded while it was probed
        state = self._registry.states.get(backend_id)
        if state is None or state.config is not backend:
            return None  # removed or replaced by a config reload while it was probed
        before = state.status
        after = judge(before, state.health.consecutive_failures, outcome, latency, self._settings)
        tools_changed = False
        if outcome != "ok":
            assert error is not None
            self._registry.record_failure(backend_id, error, after)
        elif listing is None or per_caller(backend.auth):
            # a per-caller backend's tools are listed per session, with each caller's credentials
            self._registry.record_answer(backend_id, latency, after)
        else:
            tools_changed = self._registry.record_listing(backend_id, listing, after)
        breaker = self._breakers.get(backend_id)
        if breaker is not None:
            breaker.record(outcome != "failed", after)
            self._registry.set_circuit(backend_id, breaker.state)
        reason = change_reason(backend_id, before, after, tools_changed)
        # every probe at debug (one per backend per interval); only a change of status at info
        logger.debug(
            "probe of %s: %s in %.0f ms, %s%s",
            backend_id,
            outcome,
            latency * 1000,
            after,
            f" ({error.reason})" if error else "",
        )
        if before != after:  # the one line a change gets, with its reason
            why = error.reason if error else answer_reason(before, after, latency, self._settings)
            logger.info("backend %s: %s -> %s: %s", backend_id, before, after, why)
        if reason is not None:
            self._rebuilder.request(reason)
        return reason
