"""What a request does with a backend session it had to open: keep it with the client session, before
the request is sent in it, or use it for that one request and end it.

Kept first, sent second: the backend session is stored with the client session in the indexer
(`SetBackendSession`, a compare-and-set) before the request goes out in it, so a client's
cancellation, whichever replica it reaches, finds the backend session of a call that is its
session's first call to the backend (router/upstream/session_wide/backend_notices.py). Of two
requests that open one at once, the first stored wins and the other goes on in the winner's, ending
its own at once. A request without a client session (none reaches a backend) has nothing to keep
one with: it uses the one it opened as it is.

Not every caller may keep one. A 2026-07-28 caller the router did not verify (anonymous, or a token
holder) is served from the implied session of its pseudo-principal, which every such caller shares
(docs/auth.md): a backend session kept there would be one backend session, one per_session
process, one server's state for callers who have nothing in common. Such a caller's request runs in
a backend session of its own, ended once it has answered (docs/gateway.md, "Backend sessions").
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from router.caller import Caller
from router.errors import RouterError
from router.link.indexer_client import IndexerClient
from router.upstream.calls.session_notes import SessionNote, replaced, unkept
from toolsearch.sessions import BackendSession
from toolsearch.targets import BackendTarget

logger = logging.getLogger(__name__)

# ends a backend session this router opened and does not keep (best effort, bounded)
End = Callable[[BackendSession], Awaitable[None]]


class SessionKeeper:
    """The backend sessions one request to one backend opens: kept, or used once and ended (`end`)
    by `close`."""

    def __init__(self, indexer: IndexerClient, caller: Caller, target: BackendTarget, end: End) -> None:
        self._indexer = indexer
        self._caller = caller
        self._target = target
        self._end = end
        self._unkept: list[BackendSession] = []
        self._single_use = False  # a session with state was opened for this request alone

    async def keep(self, opened: BackendSession) -> BackendSession:
        """Given each session the request opened, before the request is sent in it: the session
        to send it in (as opened where there is no client session to keep it with)."""
        if not self._caller.session_id:
            return opened
        if self._caller.shared:
            self._unkept.append(opened)
            self._single_use = bool(opened.session_id)  # one without an id keeps no state anyway
            return opened
        # shielded: a session opened and then neither kept nor ended would hold a process until
        # the backend's idle timeout, and a cancelled call must not leave one behind
        with anyio.CancelScope(shield=True):
            stored = await self._stored(opened)
            if stored.session_id == opened.session_id:
                return opened
            if stored.session_id:  # another request kept its own first: go on in that one
                await self._end(opened)
                return stored
        self._unkept.append(opened)  # not kept: this request's alone
        return opened

    async def _stored(self, opened: BackendSession) -> BackendSession:
        """Store `opened` with the client session, for every replica, in place of the target's
        session only if that is still the one stored; the session stored now (another request's when
        it stored one first; an empty one when nothing could be kept)."""
        caller, target = self._caller, self._target
        previous = target.session.session_id if target.session is not None else ""
        try:
            return await self._indexer.set_backend_session(
                caller.session_id, caller.identity.principal, target.backend_id, previous, opened
            )
        except RouterError as exc:
            logger.warning("backend %s: its new session could not be kept: %s", target.backend_id, exc)
            return BackendSession("", "")

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
