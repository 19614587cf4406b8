"""Health without processes: the status rules, the circuit breaker, the monitor and the fan-out.

Probes are fake coroutines and the breaker's clock is a number the test moves, so every case runs
in milliseconds; loops that must run for real wait on conditions, never on fixed sleeps. What a probe
sends over the wire is checked against an in-process MCP server behind the lister's transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.server.lowlevel.server import Server
from mcp.server.transport_security import TransportSecuritySettings

from indexer.backends.lister import BackendLister
from indexer.backends.registry import Registry
from indexer.errors import BackendRejected, BackendUnavailable
from indexer.state.backends import Status
from indexer.state.listings import Listing
from indexer.upkeep.health import _GUARD_SLACK as GUARD_SLACK
from indexer.upkeep.health import HealthMonitor
from indexer.upkeep.rebuilds import Rebuilder, summarise
from indexer.upkeep.verdicts import CircuitBreaker, judge
from tests.support.waits import wait_for
from toolsearch.sections.backend_settings import Backend, BackendAuth
from toolsearch.sections.indexer_settings import CircuitBreakerSettings as BreakerConfig
from toolsearch.sections.indexer_settings import Health

SETTINGS = Health(unhealthy_after=3, degraded_latency=1.0)
WAIT = 5.0  # seconds any condition below may take at most


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def listing(*names: str) -> Listing:
    return Listing(tuple({"name": n, "inputSchema": {"type": "object"}} for n in names), "2025-11-25", 0.01)


class FakeBackends:
    """A probe whose answer per backend the test sets: a listing, an exception, or a hang (None);
    or a list of them, one per probe, the last one for good."""

    def __init__(self) -> None:
        self.answers: dict[str, Listing | Exception | list[Listing | Exception | None] | None] = {}
        self.calls: dict[str, int] = {}
        self.release = asyncio.Event()  # ends every hanging probe

    async def __call__(self, backend: Backend, timeout: float) -> Listing:
        self.calls[backend.id] = self.calls.get(backend.id, 0) + 1
        answer = self.answers.get(backend.id, listing("tool"))
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        if answer is None:
            await self.release.wait()  # hangs, ignoring its timeout
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, Listing)
        return answer


class Announced:
    """Stands in for the fan-out's `Rebuilder`: notes the reason of each rebuild asked for."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def request(self, reason: str) -> None:
        self.reasons.append(reason)


def lister_of(registry: Registry, transport: httpx2.AsyncBaseTransport | None = None) -> BackendLister:
    """A lister of `registry`'s backends, without secrets, as the tests' registries have none."""
    return BackendLister(registry, {}, timeout=5.0, transport=transport)


def make_monitor(
    settings: Health = SETTINGS, clock: FakeClock | None = None, **auth: BackendAuth
) -> tuple[HealthMonitor, Registry, FakeBackends, list[str]]:
    backends = [Backend(id=b, url=f"http://127.0.0.1:9/{b}", auth=auth.get(b, BackendAuth())) for b in "abc"]
    registry = Registry(backends)
    for backend in backends:
        registry.record_listing(backend.id, listing("tool"))
    fake = FakeBackends()
    announced = Announced()
    monitor = HealthMonitor(lister_of(registry), settings, announced, probe=fake, clock=clock or FakeClock())
    return monitor, registry, fake, announced.reasons


@pytest.mark.parametrize(
    ("previous", "failures", "outcome", "latency", "expected"),
    [
        ("healthy", 0, "ok", 0.1, "healthy"),
        ("healthy", 0, "ok", 1.5, "degraded"),
        ("unhealthy", 3, "ok", 0.1, "degraded"),
        ("degraded", 0, "ok", 0.1, "healthy"),
        ("unknown", 0, "ok", 0.1, "healthy"),
        ("unknown", 1, "ok", 0.1, "degraded"),
        ("unauthenticated", 1, "ok", 0.1, "degraded"),
        ("healthy", 0, "failed", 0.0, "healthy"),
        ("degraded", 1, "failed", 0.0, "degraded"),
        ("healthy", 2, "failed", 0.0, "unhealthy"),
        ("unknown", 0, "failed", 0.0, "unhealthy"),
        ("unauthenticated", 1, "failed", 0.0, "unhealthy"),
        ("healthy", 0, "rejected", 0.0, "unauthenticated"),
    ],
)
def test_each_probe_outcome_moves_the_status_as_documented(
    previous: Status, failures: int, outcome: str, latency: float, expected: Status
) -> None:
    assert judge(previous, failures, outcome, latency, SETTINGS) == expected  # type: ignore[arg-type]


def test_the_registry_knows_which_backends_are_unadvertised_after_every_kind_of_change() -> None:
    registry = Registry([Backend(id=b, url=f"http://127.0.0.1:9/{b}") for b in "abc"])
    assert registry.unadvertised == {"a", "b", "c"}  # unknown until listed
    registry.record_listing("a", listing("t"))
    registry.record_answer("b", 0.01, "degraded")
    assert registry.unadvertised == {"c"}
    registry.record_failure("a", BackendUnavailable("a", "refused"), "unhealthy")
    assert registry.unadvertised == {"a", "c"}
    registry.adopt("c", dataclasses.replace(registry.get("c").health, status="healthy"))
    registry.remove("a")
    assert registry.unadvertised == set()
    registry.add(Backend(id="d", url="http://127.0.0.1:9/d"))
    assert registry.unadvertised == {"d"}
    assert registry.unadvertised == {b for b, s in registry.states.items() if not s.advertised}


def test_with_a_threshold_of_one_the_first_failure_makes_a_backend_unhealthy() -> None:
    assert judge("healthy", 0, "failed", 0.0, Health(unhealthy_after=1)) == "unhealthy"


def test_the_breaker_opens_on_unhealthy_skips_probes_for_the_cooldown_then_tries_once() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(cooldown=30.0, clock=clock)
    breaker.record(answered=False, status="healthy")  # below the threshold: still closed
    assert breaker.state == "closed" and breaker.allow()
    breaker.record(answered=False, status="unhealthy")
    assert breaker.state == "open" and not breaker.allow()
    clock.now += 29.9
    assert not breaker.allow()
    clock.now += 0.1
    assert breaker.allow() and breaker.state == "half-open"
    breaker.record(answered=False, status="unhealthy")  # the trial failed: a fresh cooldown
    assert breaker.state == "open" and not breaker.allow()
    clock.now += 30.0
    assert breaker.allow()
    breaker.record(answered=True, status="degraded")
    assert breaker.state == "closed" and breaker.allow()


async def test_a_backend_stays_advertised_until_its_nth_consecutive_failure() -> None:
    monitor, registry, fake, announced = make_monitor()
    fake.answers["a"] = BackendUnavailable("a", "connection refused")
    assert await monitor.check("a") is None
    assert await monitor.check("a") is None
    assert registry.get("a").status == "healthy" and registry.get("a").health.consecutive_failures == 2
    assert await monitor.check("a") == "backend a unhealthy"
    assert registry.get("a").health.last_error == "connection refused"
    assert announced == ["backend a unhealthy"]


async def test_a_recovered_backend_is_degraded_for_one_interval_and_announced_once() -> None:
    monitor, registry, fake, announced = make_monitor(Health(unhealthy_after=1))
    fake.answers["a"] = BackendUnavailable("a", "connection refused")
    await monitor.check("a")
    fake.answers.pop("a")
    assert await monitor.check("a") == "backend a recovered"
    assert registry.get("a").status == "degraded"
    assert await monitor.check("a") is None
    assert registry.get("a").status == "healthy"
    assert announced == ["backend a unhealthy", "backend a recovered"]


async def test_a_changed_tool_list_is_announced_and_an_unchanged_one_keeps_its_listing() -> None:
    monitor, registry, fake, announced = make_monitor()
    kept = registry.get("a").listing
    assert await monitor.check("a") is None
    assert registry.get("a").listing is kept  # session catalogs are memoised by listing identity
    fake.answers["a"] = listing("tool", "another")
    assert await monitor.check("a") == "backend a tool list changed"
    assert announced == ["backend a tool list changed"]


async def test_a_slow_answer_degrades_without_dropping_the_backend() -> None:
    monitor, registry, _, announced = make_monitor(Health(degraded_latency=1e-9))
    assert await monitor.check("a") is None
    assert registry.get("a").status == "degraded" and registry.get("a").advertised
    assert announced == []


async def test_a_401_is_unauthenticated_but_means_alive_for_a_passthrough_backend() -> None:
    monitor, registry, fake, _ = make_monitor(b=BackendAuth(type="passthrough"))
    fake.answers["a"] = fake.answers["b"] = BackendRejected("x", 401)
    assert await monitor.check("a") == "backend a unauthenticated"
    assert await monitor.check("b") is None
    assert registry.get("b").status == "healthy"


async def test_a_hanging_backend_is_bounded_by_the_timeout_and_stalls_no_other() -> None:
    settings = Health(interval=0.02, timeout=0.3, unhealthy_after=1)
    monitor, registry, fake, announced = make_monitor(settings)
    fake.answers["a"] = None
    monitor.start()
    try:
        await wait_for(lambda: fake.calls.get("b", 0) >= 5 and fake.calls.get("c", 0) >= 5)
        assert fake.calls["a"] == 1  # b and c went on being probed while a hung
        await wait_for(lambda: registry.get("a").status == "unhealthy")
        assert "no answer within 0.3s" in registry.get("a").health.last_error
        assert announced == ["backend a unhealthy"]
    finally:
        fake.release.set()
        await monitor.close()
    assert monitor.tracked == []
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("health-probe")]


async def test_an_open_circuit_stops_probing_until_the_cooldown_passes() -> None:
    clock = FakeClock()
    breaker = BreakerConfig(enabled=True, cooldown=60.0)
    settings = Health(interval=0.02, unhealthy_after=2, circuit_breaker=breaker)
    monitor, registry, fake, _ = make_monitor(settings, clock)
    fake.answers["a"] = BackendUnavailable("a", "connection refused")
    monitor.start()
    try:
        await wait_for(lambda: registry.get("a").health.circuit == "open")
        probed = fake.calls["a"]
        assert probed == 2
        seen_b = fake.calls["b"]
        await wait_for(lambda: fake.calls["b"] >= seen_b + 5)  # several intervals went by
        assert fake.calls["a"] == probed
        # the half-open probe succeeds; the next one hangs, so no later verdict hides its own
        fake.answers["a"] = [listing("tool"), None]
        clock.now += 60.0
        await wait_for(lambda: registry.get("a").health.circuit == "closed")
        assert registry.get("a").status == "degraded"
        assert registry.get("b").health.circuit == "closed"
    finally:
        fake.release.set()
        await monitor.close()


class GatedBackends:
    """A probe that holds each backend's answer until the test opens that backend's gate."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.started: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0

    def gate(self, backend_id: str) -> asyncio.Event:
        return self.gates.setdefault(backend_id, asyncio.Event())

    async def __call__(self, backend: Backend, timeout: float) -> Listing:
        self.started.append(backend.id)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate(backend.id).wait()
        finally:
            self.in_flight -= 1
        return listing("tool")


def listed_registry(*backends: Backend) -> Registry:
    registry = Registry(backends)
    for backend in backends:
        registry.record_listing(backend.id, listing("tool"))
    return registry


async def test_no_more_than_the_cap_of_probes_run_at_once() -> None:
    backends = [Backend(id=f"b{n}", url=f"http://127.0.0.1:9/b{n}") for n in range(6)]
    registry = listed_registry(*backends)
    gated = GatedBackends()
    monitor = HealthMonitor(lister_of(registry), Health(max_concurrent_probes=2), Announced(), probe=gated)
    checks = [asyncio.create_task(monitor.check(b.id)) for b in backends]
    await wait_for(lambda: gated.in_flight == 2 and monitor.queued == 4)
    for backend in backends:
        gated.gate(backend.id).set()
    async with asyncio.timeout(WAIT):
        await asyncio.gather(*checks)
    assert gated.most_in_flight == 2
    assert sorted(gated.started) == [b.id for b in backends]
    assert {registry.get(b.id).status for b in backends} == {"healthy"}
    assert monitor.queued == 0


async def test_waiting_for_a_slot_counts_neither_towards_the_timeout_nor_the_latency() -> None:
    slow = Backend(id="slow", url="http://127.0.0.1:9/slow")
    quick = Backend(id="quick", url="http://127.0.0.1:9/quick", timeout=0.1)
    registry = listed_registry(slow, quick)
    started: list[str] = []

    async def probe(backend: Backend, timeout: float) -> Listing:
        started.append(backend.id)
        if backend.id == "slow":
            # the slow backend's answer time: longer than quick's timeout, even with the guard's slack
            await asyncio.sleep(0.1 + GUARD_SLACK + 0.2)
        return listing("tool")

    settings = Health(max_concurrent_probes=1, unhealthy_after=1, degraded_latency=0.2)
    monitor = HealthMonitor(lister_of(registry), settings, Announced(), probe=probe)
    holding = asyncio.create_task(monitor.check("slow"))
    await wait_for(lambda: started == ["slow"])
    async with asyncio.timeout(WAIT):
        assert await monitor.check("quick") is None
        await holding
    assert registry.get("quick").status == "healthy"  # not unhealthy (timed out), not degraded (slow)
    assert registry.get("slow").status == "degraded"


async def test_untracking_a_backend_that_waits_for_a_slot_ends_its_loop_at_once() -> None:
    backends = [Backend(id=b, url=f"http://127.0.0.1:9/{b}") for b in "abc"]
    gated = GatedBackends()
    settings = Health(interval=0.02, timeout=5.0, max_concurrent_probes=1)
    monitor = HealthMonitor(lister_of(listed_registry(*backends)), settings, Announced(), probe=gated)
    monitor.start()
    try:
        await wait_for(lambda: gated.in_flight == 1 and monitor.queued == 2)
        holder = gated.started[0]
        waiting = next(b.id for b in backends if b.id != holder)
        async with asyncio.timeout(1.0):  # far less than the 5 s a probe in flight is granted
            await monitor.untrack(waiting)
        assert waiting not in gated.started and waiting not in monitor.tracked
        assert monitor.queued == 1
    finally:
        for backend in backends:
            gated.gate(backend.id).set()
        await monitor.close()
    assert monitor.tracked == []


async def test_a_failed_probe_gives_its_slot_back() -> None:
    monitor, registry, fake, _ = make_monitor(Health(max_concurrent_probes=1, unhealthy_after=1))
    fake.answers["a"] = BackendUnavailable("a", "connection refused")
    async with asyncio.timeout(WAIT):
        await monitor.check("a")
        await monitor.check("a")
        assert await monitor.check("b") is None
    assert registry.get("a").status == "unhealthy" and registry.get("b").status == "healthy"


class WireBackend(httpx2.AsyncBaseTransport):
    """The lister's shared transport to an in-process MCP server: notes each JSON-RPC method sent,
    and answers in the backend's stead with an HTTP status when the test says so."""

    def __init__(self, app: Any) -> None:
        self._inner = httpx2.ASGITransport(app)
        self.methods: list[str] = []
        self.status: int | None = None  # answer every request with this status
        self.refused: set[str] = set()  # JSON-RPC methods answered with HTTP 400
        self.closed = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        method = json.loads(request.content).get("method", "") if request.content else request.method
        self.methods.append(method)
        if self.status is not None:
            return httpx2.Response(self.status)
        if method in self.refused:
            return httpx2.Response(400, json={"error": f"{method} is not supported"})
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        self.closed = True
        await self._inner.aclose()


@contextlib.asynccontextmanager
async def wire_backend() -> AsyncIterator[tuple[WireBackend, Registry, BackendLister, HealthMonitor]]:
    """A registry of one discovered backend `m` (an in-process MCP server), its lister, and a monitor."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="add", input_schema={"type": "object"})])

    app = Server("math", on_list_tools=list_tools).streamable_http_app(
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    async with app.router.lifespan_context(app):
        transport = WireBackend(app)
        registry = Registry([Backend(id="m", url="http://m.test/mcp")])
        lister = lister_of(registry, transport)
        await lister.discover("m")
        assert registry.get("m").status == "healthy"
        monitor = HealthMonitor(lister, Health(unhealthy_after=1), Announced())
        try:
            yield transport, registry, lister, monitor
        finally:
            await monitor.close()


def answered_in(registry: Registry, backend_id: str, protocol_version: str) -> None:
    """Record the backend's tools as listed in `protocol_version`, as if it had answered in that one."""
    listed = registry.get(backend_id).listing
    assert listed is not None
    registry.record_listing(backend_id, dataclasses.replace(listed, protocol_version=protocol_version))


async def test_a_probe_speaks_the_protocol_the_backend_answered_in_without_negotiating_again() -> None:
    async with wire_backend() as (wire, registry, _, monitor):
        assert registry.get("m").health.protocol_version == "2026-07-28"
        wire.methods.clear()
        await monitor.check("m")
        assert wire.methods == ["tools/list"]  # no server/discover before it
        answered_in(registry, "m", "2025-11-25")  # as if it had answered the handshake
        wire.methods.clear()
        await monitor.check("m")
        assert wire.methods[0] == "initialize" and "server/discover" not in wire.methods
        assert registry.get("m").status == "healthy"


async def test_after_a_failed_probe_the_next_one_negotiates_the_protocol_again() -> None:
    async with wire_backend() as (wire, registry, _, monitor):
        wire.status = 503
        await monitor.check("m")
        assert registry.get("m").status == "unhealthy"
        wire.status = None
        wire.methods.clear()
        assert await monitor.check("m") == "backend m recovered"
        assert wire.methods[0] == "server/discover"
        wire.methods.clear()
        await monitor.check("m")
        assert wire.methods == ["tools/list"]


async def test_a_backend_that_dropped_its_pinned_protocol_is_listed_by_negotiating_at_once() -> None:
    async with wire_backend() as (wire, registry, _, monitor):
        answered_in(registry, "m", "2025-11-25")
        wire.refused = {"initialize"}
        wire.methods.clear()
        assert await monitor.check("m") is None
        assert wire.methods[:2] == ["initialize", "server/discover"]
        state = registry.get("m")
        assert state.status == "healthy" and state.health.consecutive_failures == 0
        assert state.health.protocol_version == "2026-07-28"


async def test_probes_of_one_backend_share_one_http_client_closed_with_the_monitor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[httpx2.AsyncClient] = []

    class CountedClient(httpx2.AsyncClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    async with wire_backend() as (wire, registry, lister, monitor):
        monkeypatch.setattr(httpx2, "AsyncClient", CountedClient)
        for _ in range(3):
            await monitor.check("m")
        assert len(built) == 1 and not built[0].is_closed
        await monitor.close()
        assert built[0].is_closed
        assert not wire.closed  # the pool is shared with discovery and every other backend
        await lister.discover("m")
        assert registry.get("m").status == "healthy"


async def test_a_kept_client_reports_a_401_only_for_the_probe_that_met_it() -> None:
    async with wire_backend() as (wire, registry, _, monitor):
        wire.status = 401
        assert await monitor.check("m") == "backend m unauthenticated"
        wire.status = 503
        await monitor.check("m")
        assert registry.get("m").status == "unhealthy"
        wire.status = None
        assert await monitor.check("m") == "backend m recovered"
        assert registry.get("m").status == "degraded"


class CountingSessions:
    """Stands in for the `SessionVersions`: notes each rebuild pass's reason, held at `gate` if given."""

    def __init__(self, gate: asyncio.Event | None) -> None:
        self.reasons: list[str] = []
        self._gate = gate

    async def rebuild_all(self, reason: str) -> int:
        self.reasons.append(reason)
        if self._gate is not None:
            await self._gate.wait()
        return 1


async def _counting(gate: asyncio.Event | None = None) -> tuple[CountingSessions, list[str]]:
    sessions = CountingSessions(gate)
    return sessions, sessions.reasons


async def test_a_burst_of_changes_gives_one_rebuild_pass() -> None:
    sessions, reasons = await _counting()
    rebuilder = Rebuilder(sessions, debounce=0.01)
    for number in range(100):
        rebuilder.request(f"backend b{number % 3} unhealthy")
    await rebuilder.idle()
    assert reasons == ["backend b0 unhealthy; backend b1 unhealthy; backend b2 unhealthy"]
    assert rebuilder.passes == 1 and not rebuilder.pending


async def test_changes_during_a_rebuild_schedule_exactly_one_more_pass() -> None:
    gate = asyncio.Event()
    sessions, reasons = await _counting(gate)
    rebuilder = Rebuilder(sessions, debounce=0.01)
    rebuilder.request("backend a unhealthy")
    await wait_for(lambda: len(reasons) == 1)
    for number in range(10):
        rebuilder.request(f"backend b{number} recovered")
    gate.set()
    await rebuilder.idle()
    assert len(reasons) == 2 and rebuilder.passes == 2
    assert reasons[1].startswith("backend b0 recovered; ") and reasons[1].endswith("and 6 more")
    await rebuilder.close()


def test_a_long_burst_is_summarised_in_one_reason() -> None:
    assert summarise(["a"]) == "a"
    assert summarise([str(n) for n in range(6)]) == "0; 1; 2; 3; and 2 more"


async def test_a_backend_asked_for_soon_is_probed_at_once_once_for_many_asks_and_no_other_is() -> None:
    monitor, registry, fake, reasons = make_monitor(Health(interval=3600))  # its own turn: an hour away
    fake.answers["a"] = listing("tool", "new_tool")
    monitor.start()
    try:
        for _ in range(5):  # five streams said so at once: one probe
            monitor.probe_soon("a")
        await wait_for(lambda: fake.calls.get("a") == 1, WAIT)
        assert reasons == ["backend a tool list changed"]
        assert registry.get("a").listing == listing("tool", "new_tool")
        monitor.probe_soon("a")  # asked again: probed again, once the gap since the last has passed
        await wait_for(lambda: fake.calls.get("a") == 2, WAIT)
        monitor.probe_soon("unknown")  # nothing to probe: ignored
    finally:
        await monitor.close()
    assert fake.calls == {"a": 2}
