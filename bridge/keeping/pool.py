"""A per_session backend's servers: one for each bridge session, at most `max_processes`.

Some servers keep state that must not be shared between callers (a browser, a shell, a scratch
memory). For those the bridge gives each session it issues a process of its own: `ProcessPool.open`
makes a `Lease` for an `initialize` (refusing with `PoolFull` when `max_processes` run already),
`bind` ties it to the session id the answer carried, and `get` finds it for the session's later
requests.

A session's process starts at its first request that can touch state (a call, a read, a prompt, a
subscription...). Until then its listings (`tools/list`, `resources/list`, `resources/templates/
list`, `prompts/list`) and pings are answered by the backend's lister: one process of the same
command, kept running like a shared backend's (`Supervisor`), that only ever lists. A fresh process
lists what any fresh process lists, so the answer is the one the session's own would give; and a
session that only lists (a health probe, a client looking before it calls) starts no process.

A `Lease` ends when its session ends (DELETE), when it has been idle for the backend's
`idle_timeout` (no request in flight, none for that long), or when its process exits. Its session
then ends with it: the process held the session's state, so a request naming it is answered 404,
and the client starts a new session, as MCP has it do for a session the server forgot.

A legacy SSE backend's sessions are leases too, each its own event stream (bridge/transports/legacy.py)
rather than a process, at most `bridge.max_sessions` of them: the endpoint opens a session's stream
at its `initialize`, with the auth header that request carried, so there is no lister (a stream
costs a connection, not a process, and a backend listed per caller must be listed with each
caller's credentials).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import anyio
import mcp_types as types
from anyio.abc import TaskGroup, TaskStatus
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError

from bridge.keeping.listeners import Listeners
from bridge.keeping.supervisor import Supervisor
from bridge.speaking.upstream import DESCRIBE_WAIT, Unavailable, Upstream, UpstreamSettings
from bridge.transports.links import Opener, StartFailed

logger = logging.getLogger(__name__)

REAP_EVERY = 5.0  # seconds between looks for idle processes (at most; a short idle_timeout looks sooner)
# what a session's lister answers until its own process runs: requests that read no session state
LISTINGS = frozenset({"ping", "tools/list", "resources/list", "resources/templates/list", "prompts/list"})


class PoolFull(MCPError):
    """Every process the backend may run is serving a session."""

    def __init__(self, message: str) -> None:
        super().__init__(types.INTERNAL_ERROR, message)


class Lease:
    """One session's own server process, from its start (at the session's first request that is not
    a listing) to its end."""

    def __init__(self, pool: ProcessPool, listeners: Listeners, headers: Mapping[str, str]) -> None:
        self.backend_id = pool.backend_id
        self.headers = headers  # what its server gets of the opening request (a legacy server's auth)
        self.session_id: str | None = None
        self.in_flight = 0
        self.last_used = anyio.current_time()
        self.reason = ""  # why it ended (or is ending)
        self.ended = anyio.Event()
        self._pool = pool
        self._listeners = listeners
        self._upstream: Upstream | None = None
        self._stop = anyio.Event()
        self._starting = anyio.Lock()
        self.started = False  # a process was started for it

    @property
    def pid(self) -> int | None:
        return self._upstream.link.pid if self._upstream is not None and not self.ended.is_set() else None

    async def upstream(self, method: str, offered: types.ClientCapabilities | None = None) -> Upstream:
        """The server that answers `method` for this session: its own process, started now if it is
        the session's first request that is not a listing, and offered the capabilities the session
        declared (`offered`: the server asks only what its one client can answer); the backend's
        lister before that."""
        lister = self._pool.lister
        listing = method in LISTINGS | {"initialize"}
        if lister is not None and listing and not self.started and not self.ended.is_set():
            return await lister.upstream(method)
        async with self._starting:
            if not self.started and not self.ended.is_set():
                await self._pool.start(self, offered)
        upstream = self._upstream
        if upstream is None or self.ended.is_set() or upstream.link.ended.is_set():
            if upstream is not None:
                await upstream.link.settle(DESCRIBE_WAIT)
            reason = self.reason or (upstream.link.exit_reason() if upstream else "") or "ended"
            raise Unavailable(
                f"backend {self.backend_id}: this session's {self._pool.opener.what} {reason}; the "
                "session's state is gone with it: start a new session"
            )
        return upstream

    def listen(self, session_id: str, session: ServerSession) -> None:
        self._listeners.add(session_id, session)

    def forget(self, session_id: str) -> None:
        self._listeners.remove(session_id)

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """Count a request in flight: a lease is idle only when none is."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self.last_used = anyio.current_time()

    def stop(self, reason: str) -> None:
        self.reason = self.reason or reason
        self._stop.set()
        if not self.started:  # no process to wait for: it ends here
            self.ended.set()

    async def run(
        self,
        opener: Opener,
        settings: UpstreamSettings,
        offered: types.ClientCapabilities | None,
        *,
        task_status: TaskStatus[None],
    ) -> None:
        """Start the server (`task_status` once it answered initialize) and keep it until the end."""
        deliver = self._listeners.deliver
        try:
            async with Upstream.open(opener, settings, deliver, self.headers, offered) as upstream:
                self._upstream = upstream
                task_status.started()
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._listeners.run)
                    tasks.start_soon(self._stop_on_exit, upstream)
                    await self._stop.wait()
                    tasks.cancel_scope.cancel()
        finally:
            self.ended.set()

    async def _stop_on_exit(self, upstream: Upstream) -> None:
        await upstream.link.ended.wait()
        await upstream.link.settle(1.0)
        self.stop(upstream.link.exit_reason() or "closed its stdout")


class ProcessPool:
    """The leases of one per_session backend, by session id; changed only through its methods."""

    def __init__(
        self,
        opener: Opener,
        settings: UpstreamSettings,
        max_processes: int,
        idle_timeout: float,
        lister: Supervisor[Upstream] | None,
        limit: str = "max_processes",
    ) -> None:
        self.backend_id = opener.backend_id
        self.opener = opener
        self.max_processes = max_processes
        self.limit = limit  # the setting `max_processes` comes from, for messages
        self.idle_timeout = idle_timeout
        # answers the listings of sessions whose own server has not started; None: each session's
        # server starts at its initialize (a legacy SSE backend's)
        self.lister = lister
        self.starts = 0  # servers started for sessions, since the bridge started
        self._settings = settings
        self._leases: set[Lease] = set()
        self._by_session: dict[str, Lease] = {}
        self._tasks: TaskGroup | None = None

    def __len__(self) -> int:
        return len(self._leases)

    def pids(self) -> list[int]:
        """The process ids of the sessions' servers running now (the lister's is not one)."""
        return sorted(pid for lease in self._leases if (pid := lease.pid) is not None)

    def _running(self) -> int:
        return sum(1 for lease in self._leases if lease.started)

    def _full(self) -> PoolFull:
        return PoolFull(
            f"backend {self.backend_id}: all {self.max_processes} of its {self.opener.many} "
            f"({self.limit}) serve other sessions; end an unused session or try again later"
        )

    async def run(self) -> None:
        """Hold the processes and reap idle ones until cancelled; every process is stopped then."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            if self.lister is not None:
                tasks.start_soon(self.lister.run)
            try:
                await self._reap()
            finally:
                self._tasks = None
                tasks.cancel_scope.cancel()

    async def open(self, headers: Mapping[str, str] | None = None) -> Lease:
        """A lease for a session about to open (its server starts later; `headers`: what the server
        gets of the opening request); raises `PoolFull` when `max_processes` run already,
        `Unavailable` when the bridge is stopping."""
        if self._tasks is None:
            raise Unavailable(f"backend {self.backend_id}: the bridge is stopping")
        if self._running() >= self.max_processes:
            raise self._full()
        lease = Lease(self, Listeners(self.backend_id, 1, self.idle_timeout), headers or {})
        self._leases.add(lease)
        return lease

    async def start(self, lease: Lease, offered: types.ClientCapabilities | None = None) -> None:
        """Start the lease's process, offered `offered` as its client's capabilities (all three when
        None); raises `PoolFull` or `Unavailable`."""
        if self._tasks is None:
            raise Unavailable(f"backend {self.backend_id}: the bridge is stopping")
        if self._running() >= self.max_processes:
            raise self._full()
        lease.started = True
        self.starts += 1
        try:
            # in use while it starts: a start slower than idle_timeout is not idleness
            with lease.in_use():
                await self._tasks.start(self._hold, lease, offered)
        except StartFailed as exc:
            message = f"backend {self.backend_id}: its {self.opener.what} did not start: {exc}"
            raise Unavailable(message, exc.status or 503) from None

    async def _hold(
        self, lease: Lease, offered: types.ClientCapabilities | None, *, task_status: TaskStatus[None]
    ) -> None:
        try:
            await lease.run(self.opener, self._settings, offered, task_status=task_status)
        finally:
            self._forget(lease)

    def _forget(self, lease: Lease) -> None:
        self._leases.discard(lease)
        if lease.session_id is not None and self._by_session.get(lease.session_id) is lease:
            del self._by_session[lease.session_id]
            if lease.started:
                logger.info(
                    "backend %s: the %s of session %s stopped: %s",
                    self.backend_id,
                    self.opener.what,
                    lease.session_id[:8],
                    lease.reason or "the bridge is stopping",
                )

    def bind(self, session_id: str, lease: Lease) -> None:
        """Tie a lease to the session its initialize opened."""
        lease.session_id = session_id
        self._by_session[session_id] = lease

    def get(self, session_id: str) -> Lease | None:
        """The live lease of a session, if any."""
        lease = self._by_session.get(session_id)
        return None if lease is None or lease.ended.is_set() else lease

    def release(self, lease: Lease, reason: str) -> None:
        """End a lease: its session ended, or never opened."""
        lease.stop(reason)
        if not lease.started:
            self._forget(lease)

    async def _reap(self) -> None:
        while True:
            await anyio.sleep(min(REAP_EVERY, self.idle_timeout / 4))
            now = anyio.current_time()
            for lease in list(self._leases):
                if lease.in_flight == 0 and now - lease.last_used > self.idle_timeout:
                    self.release(lease, f"was idle for {self.idle_timeout:g}s")
