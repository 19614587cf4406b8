"""find_tool's latency over the last minutes, as this router saw it, for the status page's chart.

Each find_tool request's time (from the access line, router/observe/access_log.py) is kept with when it
ended, for `window` seconds and at most `max_samples` of them, so a burst cannot grow it without
bound. `buckets` cuts the window into equal slices, each with its number of calls, median, 95th percentile
and maximum. Prometheus has the same latency as a histogram (router/observe/metrics.py); this exists so a
person can see it without a Prometheus server.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

WINDOW = 600.0  # seconds of history: the "last minutes" of the status page
BUCKET = 30.0  # seconds per bar of its chart
MAX_SAMPLES = 50_000


class LatencyBucket(NamedTuple):
    """One slice of the window: requests that ended in [start, start + BUCKET)."""

    start: float  # unix time
    calls: int
    p50_ms: float
    p95_ms: float
    max_ms: float


def _percentile(ordered: list[float], fraction: float) -> float:
    """The nearest-rank percentile of a sorted, non-empty list."""
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


class FindToolLatency:
    """A bounded window of find_tool request times; feed it access-line fields with `observe`."""

    def __init__(
        self,
        window: float = WINDOW,
        bucket: float = BUCKET,
        max_samples: int = MAX_SAMPLES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window = window
        self.bucket = bucket
        self._clock = clock
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)  # (ended at, ms)

    def observe(self, fields: Mapping[str, Any]) -> None:
        """Keep the time of a find_tool request (other requests are not charted)."""
        if fields.get("tool") == "find_tool":
            self.record(float(fields["ms"]))

    def record(self, ms: float) -> None:
        self._samples.append((self._clock(), ms))

    def buckets(self) -> list[LatencyBucket]:
        """Every slice of the window, oldest first; a slice without requests has count 0."""
        now = self._clock()
        while self._samples and self._samples[0][0] < now - self.window:
            self._samples.popleft()
        slices = math.ceil(self.window / self.bucket)
        first = (math.floor(now / self.bucket) - slices + 1) * self.bucket
        grouped: list[list[float]] = [[] for _ in range(slices)]
        for at, ms in self._samples:
            index = int((at - first) // self.bucket)
            if 0 <= index < slices:
                grouped[index].append(ms)
        result = []
        for index, values in enumerate(grouped):
            start = first + index * self.bucket
            if not values:
                result.append(LatencyBucket(start, 0, 0.0, 0.0, 0.0))
                continue
            values.sort()
            p50, p95 = _percentile(values, 0.5), _percentile(values, 0.95)
            result.append(LatencyBucket(start, len(values), p50, p95, values[-1]))
        return result
