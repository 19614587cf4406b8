"""A client's answer to a backend's request of it, posted to any replica, passed on to that backend.

During a call, a backend may ask its client for something (sampling, elicitation, roots); the
replica running the call passes the request on, on the call's stream, under an id that names the
backend and the backend's own id (router/upstream/wire/relays.py). The client posts its answer like any
message, and a stateless router cannot choose the replica that gets it. None needs to: the backend
waits for the answer inside the client session's backend session, which the indexer keeps, so the
replica that has the answer asks the indexer for the session's backend sessions (`BackendSessions`)
and posts the answer in the one at the backend named, under the backend's own id. The backend goes
on with the call, and the replica running it reads the rest from the backend's stream.

A 2026-07-28 backend keeps no session to post an answer in: what it asked came in an input-required
result, and the replica running the call waits for the answers in the indexer, where this replica
keeps each (router/upstream/rounds/input_rounds.py).

An answer can only reach the backend sessions of the session it is posted in: one naming another
session's request reaches that backend in this session, where no such request waits, and the
backend drops it. An answer that names no backend of the session is refused (400).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.caller import Caller
from router.errors import InvalidRequest
from router.link.indexer_client import IndexerClient
from router.upstream.calls.backends import BackendCaller
from router.upstream.calls.credentials import OutgoingCredentials
from router.upstream.rounds.input_rounds import InputRounds
from router.upstream.wire.relays import relayed_from

PASS_ON_TIMEOUT = 10.0  # seconds a backend may take to take a client's answer, at most


class ClientAnswers:
    """Passes clients' answers to relayed requests on to the backends that asked."""

    def __init__(
        self, indexer: IndexerClient, backends: BackendCaller, credentials: OutgoingCredentials
    ) -> None:
        self.indexer = indexer
        self.backends = backends
        self.credentials = credentials
        # where an answer to a 2026-07-28 backend's round goes (the app's lifespan sets it)
        self.rounds: InputRounds | None = None

    async def deliver(self, caller: Caller, answer: Mapping[str, Any]) -> bool:
        """Pass `answer` on if it answers a relayed request (True), else leave it (False).

        Raises `SessionNotFound`, `InvalidRequest` when no backend session of the caller's session is
        at the backend it names, and `BackendError`s when that backend does not take it.
        """
        origin = relayed_from(answer.get("id"))
        if origin is None or not caller.session_id:
            return False
        backend_id, request_id = origin
        if self.rounds is not None and await self.rounds.answered(caller, backend_id, request_id, answer):
            return True  # kept for the replica running the call (router/upstream/rounds/input_rounds.py)
        found = await self.indexer.backend_sessions(caller.session_id, caller.identity.principal)
        target = next((t for t in found if t.backend_id == backend_id), None)
        if target is None:
            raise InvalidRequest(
                f"no request of backend {backend_id} waits for an answer in this session: answer only "
                "the requests this session's calls passed on, while their calls run"
            )
        headers = await self.credentials.headers(target, caller.identity)
        timeout = min(target.timeout_seconds, PASS_ON_TIMEOUT)
        await self.backends.respond(target, headers, {**answer, "id": request_id}, timeout)
        return True
