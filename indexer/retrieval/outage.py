"""Whether the embedder answers now, and what happens while it does not.

An embedder that can be away (an inference server: indexer/embedder/server.py) raises
`EmbedderUnavailable` when it is down, too slow or answers garbage. The first such failure opens an
`Outage`: from then on no model call is tried (a find_tool answers from the lexical arm at once, a
build makes a lexical version) and one check a `retry_interval` asks the embedder again. The first
check it passes closes the outage and runs the callbacks that bring the dense arm back (the versions
built meanwhile are built again with their vectors: indexer/retrieval/index.py, `VersionPool`).
The reason and the time it began are what the status page and the metrics show.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable

from indexer.embedder.base import EmbedderError, EmbedderUnavailable

_log = logging.getLogger(__name__)

Check = Callable[[], None]  # blocking: returns when the embedder answered, raises EmbedderError if not


class Outage:
    """The embedder's availability: closed (answering) or open with a reason, and the checks while open.

    Thread-safe: model calls fail from worker threads. `run` (a task of the indexer's event loop)
    makes the checks and runs the `on_back` callbacks when a check passes.
    """

    def __init__(self, check: Check, retry_interval: float = 5.0) -> None:
        self._check = check
        self.retry_interval = retry_interval
        self._lock = threading.Lock()
        self._reason = ""
        self._since: float | None = None  # time.time() when it began; None while the embedder answers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._on_back: list[Callable[[], Awaitable[None]]] = []
        self.outages = 0  # outages since start
        self.lexical_answers = 0  # find_tool answers from the lexical arm alone

    @property
    def down(self) -> bool:
        return self._since is not None

    @property
    def reason(self) -> str:
        """Why the embedder is unavailable ("" while it answers)."""
        with self._lock:
            return self._reason

    @property
    def since(self) -> float | None:
        """When the outage began (Unix time), or None."""
        with self._lock:
            return self._since

    def error(self) -> EmbedderUnavailable:
        """The error a model call meets while the outage is open."""
        return EmbedderUnavailable(self.reason or "the embedding model is unavailable")

    def on_back(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run `callback` on the event loop each time an outage ends."""
        self._on_back.append(callback)

    def failed(self, exc: EmbedderUnavailable) -> None:
        """A model call met `exc`: open the outage (or keep it open), and have it checked."""
        with self._lock:
            opened = self._since is None
            self._reason = str(exc)
            if opened:
                self._since = time.time()
                self.outages += 1
        if opened:
            _log.warning(
                "embedding unavailable: %s; find_tool answers from the lexical arm until it is back "
                "(checked every %gs)",
                exc,
                self.retry_interval,
            )
            self._poke()

    def answered_lexically(self) -> None:
        with self._lock:
            self.lexical_answers += 1

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop is closing: nothing left to wake
                loop.call_soon_threadsafe(wake.set)

    def start(self) -> None:
        """Start checking (on the running loop) whenever an outage is open."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self.down:
            self._wake.set()
        self._task = asyncio.create_task(self._run(), name="embedder-outage")

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.down:
                await asyncio.sleep(self.retry_interval)
                if await self.check_now():
                    break

    async def check_now(self) -> bool:
        """Ask the embedder once (off the loop); on an answer close the outage and run `on_back`."""
        try:
            await asyncio.to_thread(self._check)
        except EmbedderUnavailable as exc:
            with self._lock:
                self._reason = str(exc)
            return False
        except EmbedderError as exc:
            with self._lock:
                self._reason = f"the embedding model failed: {exc}"
            return False
        with self._lock:
            began, self._since, self._reason = self._since, None, ""
        if began is not None:
            _log.warning("embedding is back after %.0fs: the dense arm answers again", time.time() - began)
        for callback in self._on_back:
            try:
                await callback()
            except Exception:
                _log.exception("bringing the dense arm back failed")
        return True

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
