"""A backend's health facts: one model, from a probe's verdict to the shared state and back.

The registry keeps one `BackendHealth` per backend, beside its configuration and its listing; the
lease holder publishes them as they are (`HealthStore`) and the other replicas adopt them whole.
Only the edges convert: to JSON in `indexer.state.redis`, to protobuf in `indexer.service`.
docs/health.md describes the statuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Status = Literal["healthy", "degraded", "unhealthy", "unknown", "unauthenticated"]
STATUSES: tuple[Status, ...] = get_args(Status)
ADVERTISED: frozenset[str] = frozenset({"healthy", "degraded"})  # the statuses whose tools sessions see


@dataclass(frozen=True, slots=True)
class BackendHealth:
    """What the last verdict on one backend found; the next verdict replaces it whole."""

    status: Status = "unknown"
    digest: str = ""  # of the listing the registry holds for the backend ("" while it holds none)
    # +1 each time the backend becomes advertised: what was listed before may be stale (its tools,
    # or whether a stored token is still accepted), so sessions relist passthrough backends then
    epoch: int = 0
    protocol_version: str = ""  # the one the backend answered in last; probes speak it again
    latency: float = 0.0  # seconds the last answer took
    last_error: str = ""
    consecutive_failures: int = 0
    circuit: str = ""  # the circuit breaker's state; "" when breakers are off
    checked_at: float = 0.0  # wall-clock time of the verdict

    @property
    def advertised(self) -> bool:
        return self.status in ADVERTISED
