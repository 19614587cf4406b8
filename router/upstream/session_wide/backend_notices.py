"""What a client posts that is not a request, passed on to its backends: its notifications that
concern every backend session its session keeps, and its answers to a backend's requests of it.

A handshake-era client's `notifications/cancelled` names a call that may run on another replica, and
its `notifications/roots/list_changed` says its roots changed for every server it talks to: both go
to each backend session the client session keeps (`BackendSessions`), at once, each within
`NOTICE_TIMEOUT` (or the backend's `timeout`, if lower), best effort: a backend that does not take
one is logged at debug. A cancellation also ends its call at once when it runs on this replica
(router/upstream/calls/running_calls.py). A client session's backends without a kept session
(2026-07-28, legacy SSE) have no session to tell.

During a call, a backend may ask its client for something (sampling, elicitation, roots); the
replica running the call passes the request on, on the call's stream, under an id that names the
backend and the backend's own id (router/relays.py). The client posts its answer like any message,
and a stateless router cannot choose the replica that gets it. None needs to: the backend waits for
the answer inside the client session's backend session, which the indexer keeps, so the replica
that has the answer asks the indexer for the session's backend sessions and posts the answer in the
one at the backend named, under the backend's own id (`answered`). The backend goes on with the
call, and the replica running it reads the rest from the backend's stream. A 2026-07-28 backend
keeps no session to post an answer in: what it asked came in an input-required result, and the
replica running the call waits for the answers in the indexer, where this replica keeps each
(router/upstream/rounds/stream_rounds.py). An answer can only reach the backend sessions of the
session it is posted in: one naming another session's request reaches that backend in this session,
where no such request waits, and the backend drops it. An answer that names no backend of the
session is refused (400).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import anyio

from router.caller import Caller
from router.errors import InvalidRequest, RouterError
from router.exchange import backend_request_id
from router.relays import relayed_from
from router.upstream.rounds.stream_rounds import keep_answer
from router.upstream.session_wide.backend_requests import BackendRequests

logger = logging.getLogger(__name__)

NOTICE_TIMEOUT = 2.0  # seconds one backend may take to take a notification, at most
PASS_ON_TIMEOUT = 10.0  # seconds a backend may take to take a client's answer, at most


class BackendNotices:
    """Passes a client's notifications and answers on to the backends they concern."""

    def __init__(self, requests: BackendRequests) -> None:
        self._requests = requests

    async def noticed(self, caller: Caller, method: str, params: Mapping[str, Any]) -> None:
        """A client's notification its backends are told of: a cancellation ends its call here and
        goes to every backend session; anything else (its roots changed) just goes to every one.

        The call a cancellation names may run on another replica, and only the backend knows it:
        the backend request's id comes from the client's own (`backend_request_id`), so each backend
        session is told, and the one running it stops (a backend ignores an id it does not know).
        """
        if method == "notifications/cancelled":
            request_id = params.get("requestId")
            if not isinstance(request_id, str | int) or isinstance(request_id, bool):
                return
            reason = params.get("reason") if isinstance(params.get("reason"), str) else None
            call_id = backend_request_id(request_id)
            self._requests.backends.running.cancel(caller.session_id, call_id, reason)
            params = {"requestId": call_id, **({"reason": reason} if reason else {})}
        await self.tell_all(caller, method, params)

    async def tell_all(self, caller: Caller, method: str, params: Mapping[str, Any]) -> None:
        """Send `method` with `params` inside each backend session the caller's session keeps."""
        requests = self._requests
        try:
            found = await requests.indexer.backend_sessions(caller.session_id, caller.identity.principal)
        except RouterError as exc:
            logger.debug("%s was not passed on: %s", method, exc)
            return
        async with anyio.create_task_group() as group:
            for target in found:
                within = min(target.timeout_seconds, NOTICE_TIMEOUT)
                group.start_soon(requests.backends.notify, target, method, params, caller, within)

    async def answered(self, caller: Caller, answer: Mapping[str, Any]) -> bool:
        """Pass `answer` on if it answers a relayed request (True), else leave it (False).

        Raises `SessionNotFound`, `InvalidRequest` when no backend session of the caller's session is
        at the backend it names, and `BackendError`s when that backend does not take it.
        """
        origin = relayed_from(answer.get("id"))
        if origin is None or not caller.session_id:
            return False
        backend_id, request_id = origin
        requests = self._requests
        if requests.rounds is not None and await keep_answer(
            requests.indexer, caller, backend_id, request_id, answer
        ):
            return True  # kept for the replica running the call (router/upstream/rounds/stream_rounds.py)
        found = await requests.indexer.backend_sessions(caller.session_id, caller.identity.principal)
        target = next((t for t in found if t.backend_id == backend_id), None)
        if target is None:
            raise InvalidRequest(
                f"no request of backend {backend_id} waits for an answer in this session: answer only "
                "the requests this session's calls passed on, while their calls run"
            )
        within = min(target.timeout_seconds, PASS_ON_TIMEOUT)
        await requests.backends.respond(target, {**answer, "id": request_id}, caller, within)
        return True
