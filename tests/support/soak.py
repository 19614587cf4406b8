"""A soak: many MCP clients calling find_tool and call_tool while backends flap and the indexer restarts.

    report = await soak(stack, seconds=15, flapping=("Free_NBA", "AI_Weather_by_Meteosource"))

The phases: a warm-up, once every client has had an answer (so the disruption meets calls in
flight, not clients still connecting); then `disrupt(stack)` (by default the indexer is stopped and
started again) while the clients keep calling; then, once every client has had an answer again,
`seconds` of steady load, with the flapping throughout. Each client opens a handshake-era session
and calls in a loop; a 404 ("session not found") makes it open a new one, a 503 ("indexer
unavailable") makes it retry shortly. What the report counts is what a user of the SDK's client
sees: every answer and every error it raises. Every call is bounded: one that takes longer than
`call_bound` counts as hung. The report also samples the resident memory (RSS) of the router and
indexer processes: after the warm-up, after recovery (the baseline of the growth figures) and at
the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
import psutil
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent

from tests.support.stack import Stack

MB = 1024 * 1024
RETRY_AFTER = 0.25  # seconds a client waits after a 503 before it tries again (the router says 1)
FLAP_EVERY = 1.0  # seconds between a flapping backend's state changes
RECOVERY_WAIT = 120.0  # seconds every client has to get an answer, before and again after the disruption

# (tool, arguments) pairs the clients cycle through: searches, and calls to stable and flapping backends
WORK: tuple[tuple[str, dict[str, Any]], ...] = (
    ("find_tool", {"tool_description": "basketball teams and players", "limit": 3}),
    ("call_tool", {"tool_name": "Get_All_Teams", "parameters": {"page": "1"}}),
    ("find_tool", {"tool_description": "current weather at a place", "limit": 3}),
    ("call_tool", {"tool_name": "current", "parameters": {"place_id": "london"}}),
    ("find_tool", {"tool_description": "cocktail recipes by ingredient", "limit": 3}),
    ("call_tool", {"tool_name": "Search_by_name", "parameters": {"name": "mojito"}}),
)


@dataclass
class SoakReport:
    """What happened: outcomes by kind, sessions opened, per-call latency, memory in MB."""

    clients: int
    seconds: float  # the steady phase
    outcomes: Counter[str] = field(default_factory=Counter)
    tool_errors: Counter[str] = field(default_factory=Counter)  # isError results, by kind of message
    sessions_opened: int = 0
    slowest_call: float = 0.0
    unexpected: list[str] = field(default_factory=list)  # the first few unexpected failures
    rss_mb: dict[str, dict[str, float]] = field(default_factory=dict)  # phase -> process -> MB
    disruption_seconds: float = 0.0
    warmed_clients: int = 0  # clients answered before the disruption
    recovered_clients: int = 0

    def growth_mb(self, process: str, since: str = "baseline") -> float:
        """How much `process` grew from the `since` sample to the end."""
        return self.rss_mb["end"][process] - self.rss_mb[since][process]

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcomes"] = dict(self.outcomes)
        data["tool_errors"] = dict(self.tool_errors)
        data["growth_mb"] = {name: round(self.growth_mb(name), 1) for name in self.rss_mb["end"]}
        return data


def restart_indexer(stack: Stack) -> None:
    """The default disruption: SIGTERM the indexer, then start it again (blocking)."""
    stack.stop_indexer()
    stack.start_indexer()


def rss(stack: Stack) -> dict[str, float]:
    """The resident memory of the stack's routers and indexer now, in MB."""
    sizes = {}
    for name, proc in stack.procs.items():
        if name == "indexer" or name.startswith("router"):
            sizes[name] = psutil.Process(proc.pid).memory_info().rss / MB
    return sizes


def _classify(exc: BaseException) -> str:
    # the SDK's client raises a failed `initialize` from inside its task groups: what the user sees
    # is the one error within
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        message = exc.error.message
        if "session not found" in message:
            return "session_lost"
        if "indexer unavailable" in message:
            return "unavailable"
    return "unexpected"


def _error_kind(text: str) -> str:
    """A tool error's message without what varies: the tool's or the backend's name."""
    if text.startswith("tool not found"):
        return "tool not found"
    return re.sub(r"^backend \S+ ", "backend ", text)[:60]


class _Soak:
    def __init__(self, stack: Stack, report: SoakReport, call_bound: float) -> None:
        self.stack = stack
        self.report = report
        self.call_bound = call_bound
        self.stop = asyncio.Event()
        self.disrupted = asyncio.Event()  # set once the disruption has ended
        self.warmed: set[int] = set()  # clients with an answer before the disruption
        self.all_warmed = asyncio.Event()
        self.recovered: set[int] = set()  # clients with an answer after the disruption
        self.all_recovered = asyncio.Event()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    def _failed(self, number: int, exc: BaseException) -> str:
        kind = _classify(exc)
        self.report.outcomes[kind] += 1
        if kind == "unexpected" and len(self.report.unexpected) < 10:
            self.report.unexpected.append(f"client {number}: {exc!r}"[:500])
        return kind

    def _answered(self, number: int, result: CallToolResult) -> None:
        self.report.outcomes["tool_error" if result.is_error else "ok"] += 1
        if result.is_error:
            text = result.content[0].text if isinstance(result.content[0], TextContent) else ""
            self.report.tool_errors[_error_kind(text)] += 1
        if self.disrupted.is_set():
            self.recovered.add(number)
            if len(self.recovered) == self.report.clients:
                self.all_recovered.set()
        else:
            self.warmed.add(number)
            if len(self.warmed) == self.report.clients:
                self.all_warmed.set()

    async def _calls(self, number: int, client: Client) -> None:
        """Call in a loop on one session; returns when the session is gone (404) or broke."""
        work = itertools.cycle(WORK[number % len(WORK) :] + WORK[: number % len(WORK)])
        while not self.stop.is_set():
            tool, arguments = next(work)
            started = time.monotonic()
            try:
                with anyio.fail_after(self.call_bound):
                    result = await client.call_tool(tool, arguments)
            except TimeoutError:
                self.report.outcomes["hung"] += 1
                continue
            except MCPError as exc:
                if self._failed(number, exc) == "unavailable":
                    await self._pause(RETRY_AFTER)  # the session may outlive the outage: keep it
                    continue
                return
            finally:
                self.report.slowest_call = max(self.report.slowest_call, time.monotonic() - started)
            self._answered(number, result)

    async def client(self, number: int) -> None:
        while not self.stop.is_set():
            try:
                # each client keeps to one router; with several, the clients spread over them
                router = self.stack.router_urls[number % len(self.stack.router_urls)]
                async with Client(f"{router}/mcp", mode="legacy") as client:
                    self.report.sessions_opened += 1
                    await self._calls(number, client)
            except Exception as exc:
                if self._failed(number, exc) == "unavailable":
                    await self._pause(RETRY_AFTER)

    async def flap(self, backends: Sequence[str]) -> None:
        down = False
        try:
            while not self.stop.is_set():
                down = not down
                for backend in backends:
                    await asyncio.to_thread(self.stack.control, backend, "down" if down else "up")
                await self._pause(FLAP_EVERY)
        finally:
            for backend in backends:
                await asyncio.to_thread(self.stack.control, backend, "up")


async def soak(
    stack: Stack,
    seconds: float,
    *,
    clients: int = 32,
    flapping: Sequence[str] = (),
    disrupt: Callable[[Stack], None] | None = restart_indexer,
    warm_up: float = 3.0,
    call_bound: float = 20.0,
) -> SoakReport:
    """Run the soak against `stack`; returns the report (the caller asserts on it)."""
    report = SoakReport(clients=clients, seconds=seconds)
    run = _Soak(stack, report, call_bound)
    tasks = [asyncio.create_task(run.client(n)) for n in range(clients)]
    flapper = asyncio.create_task(run.flap(flapping))
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.all_warmed.wait(), RECOVERY_WAIT)
        report.warmed_clients = len(run.warmed)
        await run._pause(warm_up)  # a phase of load, not a wait for something: the clients call meanwhile
        report.rss_mb["warm"] = rss(stack)
        if disrupt is not None:
            started = time.monotonic()
            await asyncio.to_thread(disrupt, stack)
            report.disruption_seconds = time.monotonic() - started
        run.disrupted.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.all_recovered.wait(), RECOVERY_WAIT)
        report.recovered_clients = len(run.recovered)
        report.rss_mb["baseline"] = rss(stack)
        await run._pause(seconds)  # the steady phase
        report.rss_mb["end"] = rss(stack)
    finally:
        run.stop.set()
        await asyncio.gather(*tasks, flapper, return_exceptions=True)
    return report
