"""Ending the backend sessions of client sessions that ended: a DELETE to each backend, best effort.

A router opens a backend session at the first `call_tool` of a client session to a handshake-era
backend and records it in the session's state (`SetBackendSession`); every replica reuses it. When
the client session ends (its DELETE, its expiry, its credentials rejected) the indexer, which owns
the session's state, ends those backend sessions with the DELETE of the Streamable HTTP transport.

Nothing waits for that: the sessions go into a bounded queue that a few workers drain, each DELETE
under a deadline. A backend that is down, refuses, or never answers costs one bounded attempt and a
debug line; its own idle timeout ends the session then. A full queue drops what does not fit (said
once per burst), so ending many sessions at once cannot make the indexer hold more. Expired
sessions are taken from the session store every `EXPIRY_POLL` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import NamedTuple

import httpx2

from indexer.backends.lister import BackendLister
from indexer.errors import IndexerError
from indexer.state import EndedSession, StateUnavailable
from toolsearch.outgoing import SESSION_HEADER, VERSION_HEADER
from toolsearch.responses import BoundedTransport
from toolsearch.sessions import BackendSession

logger = logging.getLogger(__name__)

DELETE_TIMEOUT = 5.0  # seconds one DELETE may take, at most (the backend's own timeout, if lower)
QUEUE_SIZE = 1000  # backend sessions waiting to be ended
WORKERS = 4  # DELETEs in flight at once
EXPIRY_POLL = 30.0  # seconds between looks for expired sessions
_ANSWER_BYTES = 65_536  # a DELETE's answer is read and dropped; no more of it is held


class _Ending(NamedTuple):
    backend_id: str
    session: BackendSession
    token: str | None


class BackendSessionEnder:
    """Ends backend sessions in the background; `start` it in the serving loop, `close` it there."""

    def __init__(
        self,
        lister: BackendLister,
        transport: httpx2.AsyncBaseTransport,
        take_expired: Callable[[], list[EndedSession]],
        poll: float = EXPIRY_POLL,
    ) -> None:
        self._lister = lister  # the backends' states, and each one's auth headers
        self._take_expired = take_expired
        self._poll = poll
        self._queue: asyncio.Queue[_Ending] = asyncio.Queue(QUEUE_SIZE)
        # the bounded transport only borrows the shared pool: closing this client leaves it open
        bounded = BoundedTransport(transport, _ANSWER_BYTES)
        self._http = httpx2.AsyncClient(transport=bounded, timeout=DELETE_TIMEOUT)
        self._tasks: list[asyncio.Task[None]] = []
        self._dropped = 0
        self.ended = 0  # DELETEs a backend answered (any status), for status and tests

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._work(), name="backend-session-ender") for _ in range(WORKERS)]
        self._tasks.append(loop.create_task(self._watch_expiry(), name="backend-session-expiry"))

    def end(self, ended: EndedSession) -> None:
        """Queue the DELETE of each of `ended`'s backend sessions; what does not fit is dropped."""
        for backend_id, session in ended.backend_sessions.items():
            if not session.session_id:
                continue  # a stateless backend's: nothing to end
            try:
                self._queue.put_nowait(_Ending(backend_id, session, ended.token))
            except asyncio.QueueFull:
                if not self._dropped:
                    logger.warning(
                        "backend sessions: more than %d wait to be ended; the rest are left to the "
                        "backends' idle timeouts",
                        QUEUE_SIZE,
                    )
                self._dropped += 1
        if self._queue.empty():
            self._dropped = 0

    def end_expired(self) -> None:
        """Queue the backend sessions of the sessions the store found expired."""
        for ended in self._take_expired():
            self.end(ended)

    async def _watch_expiry(self) -> None:
        while True:
            await asyncio.sleep(self._poll)
            self.end_expired()

    async def _work(self) -> None:
        while True:
            ending = await self._queue.get()
            try:
                await self._delete(ending)
            finally:
                self._queue.task_done()

    async def _delete(self, ending: _Ending) -> None:
        state = self._lister.registry.states.get(ending.backend_id)
        if state is None:
            return  # the backend left the configuration: nothing to reach
        backend = state.config
        try:
            headers = await self._lister.headers(backend, ending.token)
        except (IndexerError, StateUnavailable):
            # no caller token, no secret, no exchanged token: try anyway, the backend decides
            headers = {}
        headers[SESSION_HEADER] = ending.session.session_id
        if ending.session.protocol_version:
            headers[VERSION_HEADER] = ending.session.protocol_version
        try:
            response = await self._http.delete(
                backend.url, headers=headers, timeout=min(DELETE_TIMEOUT, backend.timeout)
            )
        except httpx2.HTTPError as exc:
            logger.debug("backend %s: ending a backend session failed: %r", backend.id, exc)
            return
        self.ended += 1
        if response.status_code >= 400 and response.status_code not in (404, 405):
            logger.debug("backend %s: ending a backend session answered %d", backend.id, response.status_code)

    async def drain(self, within: float) -> None:
        """Wait up to `within` seconds for the queued DELETEs (a clean stop ends what it can)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._queue.join()

    async def close(self) -> None:
        await self.drain(2.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._http.aclose()
