"""What a stdio server writes besides its messages, in our log: tagged with its backend, rate-limited.

A server's stderr is its log, read line by line into ours as `backend ID: LINE`. A server that
floods it must not flood the bridge's log (nor hold the bridge's CPU): `LogBudget` lets a burst
through and then a steady rate, counts what it held back, and says so once the flood eases. The last
few lines are kept whole (`StderrLog.tail`), because the reason a server died is usually there.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import anyio
from anyio.abc import ByteReceiveStream

# named for what it is, not where it lives: operators filter their log on this name
logger = logging.getLogger("bridge.stderr")

MAX_LINE_CHARS = 2000  # a longer line is logged cut
MAX_PENDING_BYTES = 64 * 1024  # a "line" that long without a newline is logged as it is
TAIL_LINES = 5
REPORT_EVERY = 1.0  # seconds between counts of the lines a flood had held back


class LogBudget:
    """A token bucket: `burst` lines at once, then `per_second`; the lines it refused are counted."""

    def __init__(
        self, burst: int = 50, per_second: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.per_second = per_second
        self.held_back = 0  # refused since the last line let through
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.per_second)
        self._last = now
        if self._tokens < 1:
            self.held_back += 1
            return False
        self._tokens -= 1
        return True

    def take_held_back(self) -> int:
        held, self.held_back = self.held_back, 0
        return held


class StderrLog:
    """One server process's stderr: logged under its backend's id within a budget, its tail kept."""

    def __init__(self, backend_id: str, budget: LogBudget | None = None) -> None:
        self.backend_id = backend_id
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.lines = 0
        self._budget = budget or LogBudget()

    def line(self, text: str) -> None:
        text = text.rstrip()
        if not text:
            return
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + "..."
        self.lines += 1
        self.tail.append(text)
        if self._budget.allow():
            self._report_held_back()
            logger.info("backend %s: %s", self.backend_id, text)

    def last_line(self) -> str:
        return self.tail[-1] if self.tail else ""

    async def drain(self, stream: ByteReceiveStream) -> None:
        """Read `stream` to its end (a server blocked on a full stderr pipe would stop answering)."""
        pending = b""
        try:
            async for chunk in stream:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    self.line(raw.decode("utf-8", "replace"))
                if len(pending) > MAX_PENDING_BYTES:
                    self.line(pending.decode("utf-8", "replace"))
                    pending = b""
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        if pending:
            self.line(pending.decode("utf-8", "replace"))
        self._report_held_back()

    async def report_held_back(self, every: float = REPORT_EVERY) -> None:
        """Say how many lines were held back, every `every` seconds while any were (until cancelled).

        A flood that stops lets no line through afterwards to carry the count, hence a clock of its own.
        """
        while True:
            await anyio.sleep(every)
            self._report_held_back()

    def _report_held_back(self) -> None:
        if held := self._budget.take_held_back():
            logger.warning(
                "backend %s: %d stderr lines not logged (more than %g a second)",
                self.backend_id,
                held,
                self._budget.per_second,
            )
