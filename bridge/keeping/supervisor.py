"""A shared stdio backend's one server process, kept running: started, restarted with backoff, stopped.

`Supervisor.run` starts the server and, whenever it exits or fails to start, starts it again after
a pause that doubles with each failure in a row (from `FIRST_DELAY` up to `max_restart_delay`) and
falls back to the first once a run lasted `STABLE_AFTER`. Every session of the backend is served by
the one process (`upstream`); the sessions outlive a restart, the server's own state does not.

While the server is down, requests do not wait for it: one that arrives while it is starting, or
within `QUICK_RESTART` of the restart of a server that ran and then exited, waits up to
`start_timeout`; otherwise (a server that keeps failing) it fails at once with the reason
(`Unavailable`), so a dead backend costs its callers nothing but the answer. A first start far
slower than the other servers' is waited for only as long as the bridge's readiness waits for it
(bridge/keeping/first_starts.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Generic, Literal, Protocol, TypeVar

import anyio
import mcp_types as types
from mcp.server.session import ServerSession

from bridge.keeping.first_starts import FirstStarts
from bridge.keeping.listeners import Listeners
from bridge.speaking.upstream import Notify, Unavailable, UpstreamSettings
from bridge.transports.links import Link, StartFailed
from bridge.transports.process import Launch

logger = logging.getLogger(__name__)

FIRST_DELAY = 0.5  # seconds before the first restart
STABLE_AFTER = 30.0  # a run this long resets the backoff
QUICK_RESTART = 1.0  # a restart this close is waited for by requests
# seconds between two looks of a request waiting on a first start at the others' (no event says
# that another server's first start is done)
FIRST_START_LOOK = 0.25

SupervisorState = Literal["starting", "ready", "waiting", "stopped"]


class Running(Protocol):
    """A started server as the supervisor keeps it: what it runs on."""

    @property
    def link(self) -> Link: ...


U = TypeVar("U", bound=Running)
# starts a server and yields it running (`Upstream.open`, `ModernUpstream.open`); raises StartFailed
Opens = Callable[[Launch, UpstreamSettings, Notify], AbstractAsyncContextManager[U]]


class Supervisor(Generic[U]):
    """The state of one shared backend's server; changed only by its own `run`. `opens` starts it:
    a handshake-era server (`Upstream`) or a 2026-07-28 one (bridge/speaking/modern_upstream.py)."""

    def __init__(
        self,
        launch: Launch,
        settings: UpstreamSettings,
        listeners: Listeners,
        max_delay: float,
        opens: Opens[U],
        firsts: FirstStarts | None = None,
    ) -> None:
        self.backend_id = launch.backend_id
        self.state: SupervisorState = "starting"
        self.last_error = ""
        self.starts = 0
        self.tried = anyio.Event()  # the first start has succeeded or failed
        self.tried_at: float | None = None  # when it did (anyio's clock)
        self._launch = launch
        self._settings = settings
        self._listeners = listeners
        self._max_delay = max_delay
        self._opens = opens
        self._upstream: U | None = None
        self._retry_at = 0.0
        self._back_soon = False  # the server ran, and exited for the first time in a while
        self._changed = anyio.Event()
        self._firsts = firsts  # the bridge's servers whose first starts its readiness waits for
        if firsts is not None:
            firsts.add(self)

    def _set(self, state: SupervisorState, upstream: U | None = None) -> None:
        self.state, self._upstream = state, upstream
        self._changed.set()
        self._changed = anyio.Event()

    def _tried(self) -> None:
        if self.tried_at is None:
            self.tried_at = anyio.current_time()
        self.tried.set()

    @property
    def pid(self) -> int | None:
        """The running server's process id, if one runs."""
        return self._upstream.link.pid if self._upstream is not None else None

    def accepting(self) -> bool:
        """Whether a new session may open now (the server is up, starting, or about to be)."""
        return self.state in ("ready", "starting") or self._restart_is_near()

    def _restart_is_near(self) -> bool:
        near = self._retry_at - anyio.current_time() <= QUICK_RESTART
        return self.state == "waiting" and self._back_soon and near

    def describe(self) -> str:
        """Why the backend cannot serve now, for callers."""
        wait = max(0.0, self._retry_at - anyio.current_time())
        return (
            f"backend {self.backend_id} is unavailable: its stdio server {self.last_error}; "
            f"it is started again in {wait:.0f}s"
        )

    def listen(self, session_id: str, session: ServerSession) -> None:
        self._listeners.add(session_id, session)

    def forget(self, session_id: str) -> None:
        self._listeners.remove(session_id)

    async def upstream(self, method: str = "", offered: types.ClientCapabilities | None = None) -> U:
        """The running server, once it runs, whatever the `method` and whatever its caller `offered`
        (a shared server's callers come and go: it was offered all three capabilities); raises
        `Unavailable` rather than wait for a long backoff, or for a first start the bridge no longer
        waits for."""
        with anyio.move_on_after(self._settings.start_timeout):
            while True:
                if self.state == "ready" and self._upstream is not None:
                    return self._upstream
                if self.state == "stopped" or (self.state == "waiting" and not self._restart_is_near()):
                    raise Unavailable(self.describe())
                wake = math.inf
                if self._firsts is not None and self.tried_at is None:  # waited for as readiness waits
                    cut = self._firsts.cut()
                    wake = FIRST_START_LOOK if cut is None else cut - anyio.current_time()
                    if wake <= 0:
                        raise Unavailable(self._slower_than_the_others())
                with anyio.move_on_after(wake):
                    await self._changed.wait()
        raise Unavailable(f"backend {self.backend_id}: its stdio server is still starting")

    def _slower_than_the_others(self) -> str:
        slowest = self._firsts.slowest_done() if self._firsts is not None else 0.0
        return (
            f"backend {self.backend_id}: its stdio server is still starting, far slower than the "
            f"others (they started within {slowest:.1f}s): it is served once it answers"
        )

    async def run(self) -> None:
        """Keep the server running until cancelled; the server is stopped on the way out."""
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._listeners.run)
                await self._keep_running()
        finally:
            self._set("stopped")

    async def _keep_running(self) -> None:
        failures = 0
        while True:
            self._set("starting")
            started = anyio.current_time()
            reason, ran = await self._run_once()
            self._tried()
            stable = anyio.current_time() - started >= STABLE_AFTER
            failures = 0 if stable else failures + 1
            delay = min(self._max_delay, FIRST_DELAY * 2 ** max(0, failures - 1))
            self.last_error = reason
            self._retry_at = anyio.current_time() + delay
            # Requests wait for a server that ran and exited once; a failing one answers at once.
            self._back_soon = ran and failures <= 1
            self._set("waiting")
            logger.warning(
                "backend %s: the stdio server %s; starting it again in %.1fs", self.backend_id, reason, delay
            )
            await anyio.sleep(delay)

    async def _run_once(self) -> tuple[str, bool]:
        """Start the server and serve with it until it ends; returns how it ended, and if it ran."""
        self.starts += 1
        try:
            async with self._opens(self._launch, self._settings, self._listeners.deliver) as upstream:
                logger.info(
                    "backend %s: stdio server started (pid %d): %s",
                    self.backend_id,
                    upstream.link.pid,
                    self._launch.describe(),
                )
                self._tried()
                self._set("ready", upstream)
                await upstream.link.ended.wait()
                self._retry_at, self._back_soon = anyio.current_time() + FIRST_DELAY, True
                self._set("waiting")
                await upstream.link.settle(1.0)
                return upstream.link.exit_reason() or "closed its stdout", True
        except StartFailed as exc:
            return f"did not start: {exc}", False
        except Exception as exc:  # whatever it was, the loop must go on: the next start may work
            logger.exception("backend %s: the stdio server failed", self.backend_id)
            return f"failed ({type(exc).__name__})", False
