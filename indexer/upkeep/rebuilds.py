"""Fan-out: changes to what sessions may see become new index versions for them, coalesced.

The health monitor (a backend crossing the advertised line, or its tool list changing), a config
reload and a replica taking the lease call `Rebuilder.request(reason)`, often many times in a burst
(several backends failing together, a flapping backend). Each call only records its reason;
one task, after a short debounce, runs `SessionVersions.rebuild_all` once with all the reasons
gathered so far, and that pass swaps each session to the version its backends now call for.
Changes that arrive while a pass runs schedule exactly one more pass, never one per change.
Sessions whose catalog did not change keep their version (`rebuild_all` swaps nothing for them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from indexer.sessions.versions import SessionVersions

logger = logging.getLogger(__name__)

DEBOUNCE_SECONDS = 0.05  # long enough to gather a burst, short next to any probe interval
MAX_REASONS_SHOWN = 4  # a swap record names a few reasons, then counts the rest
CLOSE_GRACE_SECONDS = 10.0  # how long close() lets a running pass finish before cancelling it


def summarise(reasons: list[str]) -> str:
    """One swap reason for a burst of changes: the first few, then how many more."""
    shown = "; ".join(reasons[:MAX_REASONS_SHOWN])
    hidden = len(reasons) - MAX_REASONS_SHOWN
    return f"{shown}; and {hidden} more" if hidden > 0 else shown


class Rebuilder:
    """Coalesces change notices into passes of `SessionVersions.rebuild_all`, one task at a time."""

    def __init__(self, versions: SessionVersions, debounce: float = DEBOUNCE_SECONDS) -> None:
        self._versions = versions
        self._debounce = debounce
        self._reasons: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.passes = 0  # rebuild passes run, for tests and logs
        self.swaps = 0  # sessions swapped over all passes

    @property
    def pending(self) -> bool:
        """Whether a change is waiting for, or being handled by, a rebuild pass."""
        return bool(self._reasons) or (self._task is not None and not self._task.done())

    def request(self, reason: str) -> None:
        """Note a change, to be rebuilt for in the next pass; must be called on the event loop."""
        if self._closed:
            return
        if reason not in self._reasons:
            self._reasons.append(reason)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="index-fan-out")

    async def _run(self) -> None:
        while self._reasons:
            await asyncio.sleep(self._debounce)
            if self._closed:
                return
            reasons, self._reasons = self._reasons, []
            reason = summarise(reasons)
            try:
                swapped = await self._versions.rebuild_all(reason)
            except Exception:
                # the next change tries again; until then sessions keep their current versions
                logger.exception("rebuilding sessions after %r failed", reason)
                continue
            self.passes += 1
            self.swaps += swapped
            logger.info("%s: %d sessions moved to a new index version", reason, swapped)

    async def idle(self) -> None:
        """Wait until no change is pending (tests and shutdown)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def close(self) -> None:
        """Drop pending changes, let a running pass finish (bounded), and take no more."""
        self._closed = True
        self._reasons.clear()
        task, self._task = self._task, None
        if task is None:
            return
        # A pass may be listing passthrough backends; cancelling an MCP client mid-exchange can
        # leave the SDK's tasks waiting forever, so it gets a grace period first.
        done, _ = await asyncio.wait({task}, timeout=CLOSE_GRACE_SECONDS)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
