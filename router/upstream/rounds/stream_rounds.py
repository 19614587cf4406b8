"""A 2026-07-28 backend's input-required result for a handshake-era client: asked on the call's
stream, answered through any replica.

A backend of the 2026-07-28 era alone (one that refuses the initialize handshake) asks its client
for something by answering a request with an input-required result. A handshake-era client takes
such requests only on the call's stream, and posts its answers to whichever replica. The replica
running the call (`StreamAsker.collect`) keeps a record of the round with the client session in the
indexer (`KeepInputRound`), passes each of the backend's requests on, on the call's stream, under an
id that names the backend, the round and the request's place in it (`round:<token>:<n>`), and reads
the indexer until an answer to each is there. The replica the client's answer reaches
(`keep_answer`, router/upstream/session_wide/backend_notices.py) checks that the round is open in this session
and at that backend, and keeps the answer there. The call is then sent to the backend again with the
answers and the backend's own request state (router/upstream/calls/eras.py), all within the backend's
`timeout`. A client that refuses a request fails the call, saying so.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import anyio

from router.caller import Caller
from router.errors import BackendError, InvalidRequest
from router.link.indexer_client import IndexerClient
from router.relays import NotificationRelay
from toolsearch.sessions import BackendSession

ROUND = "round:"  # the own id of a request a `StreamAsker` asked, before its round's token and place
KEPT_AFTER = 60.0  # seconds a round outlives its call's timeout, for the client's last answer or retry
POLL_FIRST, POLL_LAST = 0.02, 0.25  # seconds between two reads of a round waiting for what it waits for


class StreamAsker:
    """One call's way to ask its handshake-era client what a 2026-07-28 backend's input-required
    result asks: each request on the call's stream, the answers gathered from any replica."""

    def __init__(self, indexer: IndexerClient, caller: Caller, relay: NotificationRelay) -> None:
        self._indexer = indexer
        self._caller = caller
        self._relay = relay

    async def ask(
        self, backend_id: str, session: BackendSession, request: Mapping[str, Any], within: float
    ) -> bool:
        """False: a handshake-era backend's request goes on the call's stream, not through a round."""
        return False

    async def collect(
        self, backend_id: str, requests: Mapping[str, Any], within: float
    ) -> dict[str, Any] | None:
        """Ask each of `requests` on the call's stream under an id naming this round and its place,
        keep the round in the indexer, and wait (polling it) for the answers any replica keeps there."""
        caller, indexer = self._caller, self._indexer
        keys = list(requests)
        token = secrets.token_urlsafe(24)
        record = {"state": "asked", "backend": backend_id, "keys": len(keys), "within": within}
        ttl = within + KEPT_AFTER
        await indexer.keep_input_round(caller.session_id, caller.identity.principal, token, record, ttl)
        for place, key in enumerate(keys):
            request = requests[key]
            if not isinstance(request, dict):
                return None
            asked = {"method": request.get("method"), "params": request.get("params") or {}}
            if not await self._relay.ask(
                backend_id, {"jsonrpc": "2.0", "id": f"{ROUND}{token}:{place}", **asked}
            ):
                return None
        answers: dict[str, Any] = {}
        wait = POLL_FIRST
        while len(answers) < len(keys):  # bounded by the call's own deadline
            await anyio.sleep(wait)
            wait = min(wait * 2, POLL_LAST)
            for place, key in enumerate(keys):
                if key in answers:
                    continue
                kept = await indexer.read_input_round(
                    caller.session_id, caller.identity.principal, f"{token}-{place}"
                )
                if kept is None:
                    continue
                if "error" in kept:
                    raise BackendError(
                        backend_id, f"asked the client for {key}, which refused: {kept['error']}"
                    )
                answers[key] = kept.get("result")
        return answers


async def keep_answer(
    indexer: IndexerClient,
    caller: Caller,
    backend_id: str,
    request_id: str | int,
    answer: Mapping[str, Any],
) -> bool:
    """Keep a handshake-era client's answer to a request a `StreamAsker` asked (its id names the
    round), for the replica running the call; False when the id names none. Raises `InvalidRequest`
    for a round not open in this session."""
    if not isinstance(request_id, str) or not request_id.startswith(ROUND):
        return False
    token, _, place = request_id[len(ROUND) :].rpartition(":")
    record = await indexer.read_input_round(caller.session_id, caller.identity.principal, token)
    within = record.get("within") if record is not None else None
    if (
        record is None
        or record.get("backend") != backend_id
        or not place.isdigit()
        or int(place) >= int(record.get("keys", 0))
        or not isinstance(within, int | float)
    ):
        raise InvalidRequest(
            f"no request of backend {backend_id} waits for an answer in this session: answer only "
            "the requests this session's calls passed on, while their calls run"
        )
    kept = {"error": answer["error"]} if "error" in answer else {"result": answer.get("result")}
    await indexer.keep_input_round(
        caller.session_id, caller.identity.principal, f"{token}-{place}", kept, within + KEPT_AFTER
    )
    return True
