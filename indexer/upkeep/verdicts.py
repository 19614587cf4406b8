"""A backend's verdicts: the status one probe's outcome gives, why it changed, and the circuit breaker.

`judge` turns the previous status and one outcome into the next status; `CircuitBreaker` decides
whether a dead backend is probed at all; `change_reason` names what sessions may see differently
after a verdict (the rebuild's reason) and `answer_reason` why an answer changed a status (its log
line). The health monitor (indexer/upkeep/health.py) probes and applies them; docs/health.md
describes the statuses and transitions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from indexer.state.backends import ADVERTISED, Status
from toolsearch.sections.indexer_settings import Health

Outcome = Literal["ok", "rejected", "failed"]
Circuit = Literal["closed", "open", "half-open"]
Clock = Callable[[], float]


def judge(previous: Status, failures: int, outcome: Outcome, latency: float, settings: Health) -> Status:
    """The status after one probe, given the status and consecutive failures before it.

    - An answer: `degraded` when slower than `degraded_latency`, or when the backend was not
      advertised and had failed before (one interval on probation after recovering); else `healthy`.
    - A 401/403 to the indexer's own credentials: `unauthenticated` at once (an answer, not a fault
      that may pass).
    - A failure: `unhealthy` once `unhealthy_after` failures are consecutive. Fewer keep an
      advertised status, so one lost probe does not drop a backend; a backend that is not advertised
      has nothing to keep and is `unhealthy` at once (so a backend down at startup is never advertised).
    """
    if outcome == "ok":
        if latency > settings.degraded_latency:
            return "degraded"
        recovering = previous not in ADVERTISED and (previous != "unknown" or failures > 0)
        return "degraded" if recovering else "healthy"
    if outcome == "rejected":
        return "unauthenticated"
    if failures + 1 >= settings.unhealthy_after or previous not in ADVERTISED:
        return "unhealthy"
    return previous


class CircuitBreaker:
    """Closed (probe), open (skip probes for `cooldown` seconds), half-open (one trial probe)."""

    def __init__(self, cooldown: float, clock: Clock = time.monotonic) -> None:
        self.cooldown = cooldown
        self._clock = clock
        self.state: Circuit = "closed"
        self._opened_at = 0.0

    def allow(self) -> bool:
        """Whether to probe now; an open breaker turns half-open once the cooldown has passed."""
        if self.state == "open" and self._clock() - self._opened_at >= self.cooldown:
            self.state = "half-open"
        return self.state != "open"

    def record(self, answered: bool, status: Status) -> None:
        """Close on an answer; open when the backend turns unhealthy or a trial probe fails."""
        if answered:
            self.state = "closed"
        elif self.state == "half-open" or status == "unhealthy":
            self.state = "open"
            self._opened_at = self._clock()


def change_reason(backend_id: str, before: Status, after: Status, tools_changed: bool) -> str | None:
    """Why sessions need a new version after a verdict, or None when they do not."""
    if (before in ADVERTISED) != (after in ADVERTISED):
        if after in ADVERTISED:
            return f"backend {backend_id} {'discovered' if before == 'unknown' else 'recovered'}"
        return f"backend {backend_id} {after}"
    if tools_changed and after in ADVERTISED:
        return f"backend {backend_id} tool list changed"
    return None


def answer_reason(before: Status, after: Status, latency: float, settings: Health) -> str:
    """Why an answer changed a backend's status: how fast it came, and what that means."""
    answered = f"answered in {latency * 1000:.0f} ms"
    if latency > settings.degraded_latency:
        return f"{answered}, slower than health.degraded_latency ({settings.degraded_latency:g}s)"
    if after == "degraded":
        return f"{answered}, after failing: degraded for one interval"
    return answered
