"""Warnings that arrive in bursts, logged once per burst: a flood must not turn into a flood of log lines.

`BurstLog.note(detail)` logs the first event of a burst at WARNING, with its detail and the setting
that governs it, then only counts. A burst ends once `quiet` seconds pass without an event: the
count of the events not logged is written then (from the event loop, or at the next event when no
loop runs), and the next event starts a new burst.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable


class BurstLog:
    """One kind of warning, logged once per burst of it."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        hint: str,
        quiet: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._what = what  # e.g. "refused connections over router.max_connections (1000)"
        self._hint = hint  # how to change it, e.g. "raise router.max_connections"
        self._quiet = quiet
        self._clock = clock
        self._last: float | None = None  # when the current burst's latest event came
        self._started = 0.0
        self._unlogged = 0
        self._timer: asyncio.TimerHandle | None = None

    def note(self, detail: str = "") -> None:
        """Count one event; the first of a burst is logged."""
        now = self._clock()
        if self._last is not None and now - self._last <= self._quiet:
            self._unlogged += 1
            self._last = now
            return
        self._summarise()
        self._started = self._last = now
        suffix = f": {detail}" if detail else ""
        self._logger.warning(
            "%s%s (%s); more in the next %gs are counted, not logged",
            self._what,
            suffix,
            self._hint,
            self._quiet,
        )
        self._arm()

    def _arm(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the next event writes the summary
        self._timer = loop.call_later(self._quiet, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._last is None:
            return
        idle = self._clock() - self._last
        if idle >= self._quiet:
            self._summarise()
            self._last = None
        else:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._quiet - idle, self._check)

    def _summarise(self) -> None:
        if self._unlogged:
            took = (self._last or self._started) - self._started
            self._logger.warning("%s: %d more over %.1fs", self._what, self._unlogged, took)
        self._unlogged = 0

    def close(self) -> None:
        """Write what is still unlogged and stop the timer (at shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._summarise()
        self._last = None
