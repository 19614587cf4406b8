"""When a start has waited long enough for its slowest parts: the one rule the bridge and the indexer
share, so that one broken server never holds the others' readiness.

At start, the bridge waits for its stdio servers' first starts and the indexer for its first
listing of every backend. A server that never answers would hold them until its own timeout
(`bridge.start_timeout`, `indexer.discovery_timeout`), and the gateway with them. So each waits for
all its parts until the first of them is done; from then on, for the others only as long again as
that took so far, and at least `MIN_GRACE` seconds more: parts that are slow in the usual way (a
server that takes a second longer to start than its neighbours) are still waited for; one that
takes far longer than all the others is not. What was not waited for goes on in the background
and joins as it comes (docs/health.md, "At startup").
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_GRACE = 2.0  # seconds a part still pending is waited for, at least, after the last one done


def waited_enough(elapsed: float, done_at: Sequence[float], pending: int) -> bool:
    """Whether a start `elapsed` seconds in may stop waiting, with parts done at `done_at` seconds
    (since the start) and `pending` parts not done."""
    if pending == 0:
        return True
    if not done_at:
        return False  # nothing is ready yet: waiting costs the others nothing
    return elapsed >= cut_at(done_at)


def cut_at(done_at: Sequence[float]) -> float:
    """The seconds since the start at which parts still pending are no longer waited for."""
    last = max(done_at)
    return max(2 * last, last + MIN_GRACE)
