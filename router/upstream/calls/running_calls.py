"""The calls this router process is running now, so a cancellation that reaches it ends its own at once.

A client's `notifications/cancelled` may reach any replica; the backend hears of it through the
client session's backend sessions (router/upstream/session_wide/backend_notices.py), which covers a
call running on another replica once its backend has it. The replica that runs the call
(router/upstream/calls/backends.py) also stops waiting at once when the cancellation reaches it:
whatever stage the call is in (opening the backend session,
keeping it, waiting for the answer) and whichever way it reaches its backend (a kept session, a
request of its own to a 2026-07-28 backend, a legacy SSE connection, whose closing the backend
sees). A call is known by its client session and the id its backend request carries
(`backend_request_id`); one entry per call in flight, gone when it ends, so the table is bounded
by the requests the router serves at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio


class RunningCall:
    """One call in flight: its cancel scope, and the client's reason once cancelled."""

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        """Whether the cancellation cut the call short (one that came after its answer did not)."""
        return self.scope.cancelled_caught


class RunningCalls:
    """The calls in flight in this process, by (client session id, backend request id)."""

    def __init__(self) -> None:
        self._calls: dict[tuple[str, str], RunningCall] = {}

    def __len__(self) -> int:
        return len(self._calls)

    @contextmanager
    def running(self, session_id: str, call_id: str | None) -> Iterator[RunningCall]:
        """Hold a call's entry while it runs; the body runs inside its cancel scope."""
        call = RunningCall()
        key = (session_id, call_id or "")
        # a call without an id or a session cannot be named by a cancellation: not entered
        named = bool(session_id and call_id) and key not in self._calls
        if named:
            self._calls[key] = call
        try:
            with call.scope:
                yield call
        finally:
            if named:
                del self._calls[key]

    def cancel(self, session_id: str, call_id: str, reason: str | None) -> bool:
        """Cancel the call of the session under that id, if it runs here; returns whether it did."""
        call = self._calls.get((session_id, call_id))
        if call is None:
            return False
        call.reason = reason
        call.scope.cancel()
        return True
