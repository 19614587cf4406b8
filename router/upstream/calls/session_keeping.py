"""What a request does with a backend session it had to open: keep it with the client session, before
the request is sent in it, or use it for that one request and end it.

Kept first, sent second: the backend session is stored with the client session in the indexer
(`SetBackendSession`, a compare-and-set) before the request goes out in it, so a client's
cancellation, whichever replica it reaches, finds the backend session of a call that is its
session's first call to the backend (router/handlers/tool_calls.py). Of two requests that open one
at once, the first stored wins and the other goes on in the winner's, ending its own at once.

Not every caller may keep one. A 2026-07-28 caller the router did not verify (anonymous, or a token
holder) is served from the implied session of its pseudo-principal, which every such caller shares
(docs/auth.md): a backend session kept there would be one backend session, one per_session
process, one server's state for callers who have nothing in common. Such a caller's request runs in
a backend session of its own, ended once it has answered (docs/gateway.md, "Backend sessions").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import anyio

from router.caller import Caller
from router.errors import RouterError
from router.link.indexer_client import IndexerClient
from router.upstream.calls.backends import BackendCaller
from router.upstream.calls.session_notes import SessionNote, replaced, unkept
from toolsearch.sessions import BackendSession
from toolsearch.targets import BackendTarget

logger = logging.getLogger(__name__)

END_TIMEOUT = 2.0  # seconds to end a backend session that is not kept, at most


async def keep_backend_session(
    indexer: IndexerClient, caller: Caller, target: BackendTarget, opened: BackendSession
) -> BackendSession:
    """Store `opened` with the client session, for every replica; returns the session stored now.

    It replaces the target's `session` only if that is still the one stored; when another request
    stored one first, that one is returned. A failure returns an empty session: nothing is kept.
    """
    previous = target.session
    try:
        return await indexer.set_backend_session(
            caller.session_id,
            caller.identity.principal,
            target.backend_id,
            previous.session_id if previous is not None else "",
            opened,
        )
    except RouterError as exc:
        logger.warning("backend %s: its new session could not be kept: %s", target.backend_id, exc)
        return BackendSession("", "")


class SessionKeeper:
    """The backend sessions one request to one backend opens: kept, or used once and ended by `close`.

    Called with each session the request opened, before the request is sent in it; returns the
    session to send it in.
    """

    def __init__(
        self,
        indexer: IndexerClient,
        backends: BackendCaller,
        caller: Caller,
        target: BackendTarget,
        headers: Mapping[str, str],
    ) -> None:
        self._indexer = indexer
        self._backends = backends
        self._caller = caller
        self._target = target
        self._headers = headers
        self._unkept: list[BackendSession] = []
        self._single_use = False  # a session with state was opened for this request alone

    async def __call__(self, opened: BackendSession) -> BackendSession:
        if self._caller.shared:
            self._unkept.append(opened)
            self._single_use = bool(opened.session_id)  # one without an id keeps no state anyway
            return opened
        # shielded: a session opened and then neither kept nor ended would hold a process until
        # the backend's idle timeout, and a cancelled call must not leave one behind
        with anyio.CancelScope(shield=True):
            stored = await keep_backend_session(self._indexer, self._caller, self._target, opened)
            if stored.session_id == opened.session_id:
                return opened
            if stored.session_id:  # another request kept its own first: go on in that one
                await self._end(opened)
                return stored
        self._unkept.append(opened)  # not kept: this request's alone
        return opened

    def note(self, replaced_because: str) -> SessionNote | None:
        """What the result is to say of its backend session (router/upstream/calls/session_notes.py), given
        why a gone session was replaced ("" if none was)."""
        if replaced_because:
            return replaced(self._target.backend_id, replaced_because)
        if self._single_use:
            return unkept(self._target.backend_id)
        return None

    async def close(self) -> None:
        """End the sessions this request used and did not keep."""
        with anyio.CancelScope(shield=True):
            while self._unkept:
                await self._end(self._unkept.pop())

    async def _end(self, session: BackendSession) -> None:
        within = min(self._target.timeout_seconds, END_TIMEOUT)
        await self._backends.end_session(self._target, session, self._headers, within)
