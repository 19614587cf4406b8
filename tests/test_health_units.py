"""Health without processes: the status rules, the circuit breaker, the monitor and the fan-out.

Probes are fake coroutines and the breaker's clock is a number the test moves, so every case runs
in milliseconds; loops that must run for real wait on conditions, never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from indexer.discovery import Listing
from indexer.errors import BackendRejected, BackendUnavailable
from indexer.fanout import Rebuilder, summarise
from indexer.health import CircuitBreaker, HealthMonitor, judge
from indexer.registry import Registry, Status
from toolsearch.config import Backend, BackendAuth, Health
from toolsearch.config import CircuitBreaker as BreakerConfig

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
    """A probe whose answer per backend the test sets: a listing, an exception, or a hang."""

    def __init__(self) -> None:
        self.answers: dict[str, Listing | Exception | None] = {}
        self.calls: dict[str, int] = {}
        self.release = asyncio.Event()  # ends every hanging probe

    async def __call__(self, backend: Backend, timeout: float) -> Listing:
        self.calls[backend.id] = self.calls.get(backend.id, 0) + 1
        answer = self.answers.get(backend.id, listing("tool"))
        if answer is None:
            await self.release.wait()  # hangs, ignoring its timeout
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, Listing)
        return answer


def make_monitor(
    settings: Health = SETTINGS, clock: FakeClock | None = None, **auth: BackendAuth
) -> tuple[HealthMonitor, Registry, FakeBackends, list[str]]:
    backends = [Backend(id=b, url=f"http://127.0.0.1:9/{b}", auth=auth.get(b, BackendAuth())) for b in "abc"]
    registry = Registry(backends, {}, timeout=5.0)
    for backend in backends:
        registry.record_listing(backend.id, listing("tool"))
    fake = FakeBackends()
    announced: list[str] = []
    registry.subscribe(announced.append)
    return HealthMonitor(registry, settings, fake, clock or FakeClock()), registry, fake, announced


async def wait_for(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)  # polling: the conditions are plain attributes, nothing to await


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
    assert registry.get("a").status == "healthy" and registry.get("a").consecutive_failures == 2
    assert await monitor.check("a") == "backend a unhealthy"
    assert registry.get("a").last_error == "connection refused"
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
        assert "no answer within 0.3s" in registry.get("a").last_error
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
        await wait_for(lambda: registry.get("a").circuit == "open")
        probed = fake.calls["a"]
        assert probed == 2
        seen_b = fake.calls["b"]
        await wait_for(lambda: fake.calls["b"] >= seen_b + 5)  # several intervals went by
        assert fake.calls["a"] == probed
        fake.answers.pop("a")
        clock.now += 60.0
        await wait_for(lambda: registry.get("a").circuit == "closed")
        assert registry.get("a").status == "degraded"
        assert registry.get("b").circuit == "closed"
    finally:
        await monitor.close()


async def _counting(
    gate: asyncio.Event | None = None,
) -> tuple[Callable[[str], Awaitable[int]], list[str]]:
    reasons: list[str] = []

    async def rebuild_all(reason: str) -> int:
        reasons.append(reason)
        if gate is not None:
            await gate.wait()
        return 1

    return rebuild_all, reasons


async def test_a_burst_of_changes_gives_one_rebuild_pass() -> None:
    rebuild_all, reasons = await _counting()
    rebuilder = Rebuilder(rebuild_all, debounce=0.01)
    for number in range(100):
        rebuilder.request(f"backend b{number % 3} unhealthy")
    await rebuilder.idle()
    assert reasons == ["backend b0 unhealthy; backend b1 unhealthy; backend b2 unhealthy"]
    assert rebuilder.passes == 1 and not rebuilder.pending


async def test_changes_during_a_rebuild_schedule_exactly_one_more_pass() -> None:
    gate = asyncio.Event()
    rebuild_all, reasons = await _counting(gate)
    rebuilder = Rebuilder(rebuild_all, debounce=0.01)
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
