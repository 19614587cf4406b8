"""A handshake-era backend's request of a 2026-07-28 client, as input-required rounds, through any replica.

A 2026-07-28 client takes no request on a stream: a server asks it for something (sampling,
elicitation, roots) by answering the call with an input-required result, and the client calls again
with its answers. A handshake-era backend asks on the call's stream instead, and waits there for the
answer. The router joins the two:

1. A 2026-07-28 client's call that may be asked (it declared what answers a backend's request) runs
   in a task of the router's own (`InputRounds.run`), not the client's request: the backend's
   session is offered the client's capabilities, and the call's stream is read there. A resource
   read or a prompt is run the same way (router/upstream/session_wide/backend_requests.py).
2. When the backend asks, the replica running the call keeps a record of the round with the client
   session in the indexer (`KeepInputRound`: the backend, its session, its request's id), under a
   token of its own, and answers the client's request with an input-required result carrying the
   backend's request as it came and `toolsearch:<token>` as its request state. The call goes on in
   its task, waiting for the backend as before.
3. The client calls again with its answers and that state, on whichever replica (`resume`). That
   replica reads the round (`ReadInputRound`: a token of another session, or made up, finds none,
   and the retry is refused as invalid params; one lacking an answer is asked it again), posts each
   answer to the backend inside the backend session the round names, where the backend waits for
   it, and reads the round again until the replica running the call wrote what the call came to:
   its result, or the next round, whose record was kept first. It answers the client with that.

The other way round, a 2026-07-28 backend's input-required result for a handshake-era client, is
router/upstream/rounds/stream_rounds.py's.

Nothing but the indexer is shared between replicas. Bounds: at most `MAX_RUNNING` such calls in tasks
on one replica (beyond, a backend's request of such a client is refused, as one from a client that
cannot answer it); a backend's requests become rounds one after the other, each the outcome of
the one before; every round lasts at most as long as the call may (the backend's `timeout`), and a client
that never answers costs the backend a refusal at that timeout and holds nothing after it.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

import anyio
from anyio.abc import TaskGroup
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

from router.caller import Caller
from router.error_answers import mcp_error, tool_result_for
from router.errors import (
    BackendError,
    BackendUnavailable,
    InvalidRequestState,
    RouterError,
    RouterStopping,
)
from router.exchange import Exchange
from router.link.indexer_client import IndexerClient
from router.upstream.calls.backends import BackendCaller
from router.upstream.rounds.stream_rounds import KEPT_AFTER, POLL_FIRST, POLL_LAST, StreamAsker
from toolsearch.sessions import BackendSession

logger = logging.getLogger(__name__)

STATE_PREFIX = "toolsearch:"  # the request state of a round the router made, before its token
MAX_RUNNING = 256  # calls of 2026-07-28 clients that may be asked, running in tasks on one replica
ANSWER_WITHIN = 10.0  # seconds a backend may take to take a client's answer, at most
MAX_ASKED_KEPT = 64 * 1024  # characters of a backend's request a round keeps, to ask it again

Call = Callable[[Exchange], Awaitable[dict[str, Any]]]  # a request's work, for the exchange given
Failed = Callable[[RouterError], dict[str, Any]]  # what a router error after the first round comes to
FAILED_KEY = "toolsearch/failed"  # an outcome that is a JSON-RPC error: its code and message


def failed_outcome(exc: RouterError) -> dict[str, Any]:
    """The outcome of a read or a prompt that failed after its first round: its JSON-RPC error."""
    error = mcp_error(exc).error
    return {FAILED_KEY: {"code": error.code, "message": error.message}}


def raise_if_failed(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """A round's outcome as the request answers it; raises `MCPError` for a `failed_outcome`."""
    failure = outcome.get(FAILED_KEY)
    if isinstance(failure, dict):
        raise MCPError(int(failure.get("code", INTERNAL_ERROR)), str(failure.get("message", "")))
    return dict(outcome)


def input_required(token: str, key: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """The input-required result that asks the client the backend's `request` under `key`."""
    return {
        "resultType": "input_required",
        "inputRequests": {key: asked_of(request)},
        "requestState": STATE_PREFIX + token,
    }


def asked_of(request: Mapping[str, Any]) -> dict[str, Any]:
    """What a round asks the client of a backend's `request`: its method and params."""
    return {"method": request.get("method"), "params": request.get("params") or {}}


class RoundAsker:
    """One call's way to ask its client: rounds kept in the indexer, the first answered at once."""

    def __init__(self, rounds: InputRounds, caller: Caller) -> None:
        self._rounds = rounds
        self._caller = caller
        self._ttl = KEPT_AFTER  # the call's timeout and more, once a backend asks within it
        self.first: anyio.Event = anyio.Event()  # set once the client's request has its answer
        self.answer: dict[str, Any] | None = None  # that answer, when it is a round's
        self._open = ""  # the token of the last round, whose outcome is not written yet; "" when none

    async def ask(
        self, backend_id: str, session: BackendSession, request: Mapping[str, Any], within: float
    ) -> bool:
        """Ask the client the backend's `request`, which waits in `session` for at most `within`
        seconds (the call's timeout); False when it cannot be kept. A request after the first is the
        next round, which the client gets as what the round before came to: the backend asked it
        after that round's answer, or beside it, and either way the client answers in turn."""
        request_id = request.get("id")
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            return False
        token = secrets.token_urlsafe(24)
        self._ttl = within + KEPT_AFTER
        record = {
            "state": "asked",
            "backend": backend_id,
            "session": [session.session_id, session.protocol_version],
            "requests": {"0": request_id},
            "within": within,
        }
        asked = asked_of(request)
        if len(json.dumps(asked)) <= MAX_ASKED_KEPT:  # to ask again a retry that lacks its answer
            record["asked"] = {"0": asked}
        caller = self._caller
        try:
            await self._rounds.indexer.keep_input_round(
                caller.session_id, caller.identity.principal, token, record, self._ttl
            )
            asked = input_required(token, "0", request)
            if self.first.is_set():  # a later round: the client's retry reads it as the last one's outcome
                await self.done(asked)
            else:
                self.answer = asked
                self.first.set()
        except RouterError as exc:
            logger.info("backend %s: its request of a 2026-07-28 client was not kept: %s", backend_id, exc)
            return False
        self._open = token
        return True

    async def collect(
        self, backend_id: str, requests: Mapping[str, Any], within: float
    ) -> dict[str, Any] | None:
        """None: a 2026-07-28 client takes a 2026-07-28 backend's input-required result as it came."""
        return None

    async def done(self, outcome: Mapping[str, Any]) -> None:
        """Write what the open round came to, for the retry that waits for it (best effort)."""
        token, self._open = self._open, ""
        if not token:
            return
        caller = self._caller
        record = {"state": "done", "outcome": dict(outcome)}
        try:
            await self._rounds.indexer.keep_input_round(
                caller.session_id, caller.identity.principal, token, record, self._ttl
            )
        except RouterError as exc:
            logger.info("a call's outcome could not be kept for its client's retry: %s", exc)


class InputRounds:
    """Runs the calls of 2026-07-28 clients that a handshake-era backend may ask, in `group`."""

    def __init__(self, indexer: IndexerClient, backends: BackendCaller, group: TaskGroup) -> None:
        self.indexer = indexer
        self.backends = backends
        self._group = group
        self.running = 0

    def on_stream(self, exchange: Exchange) -> Exchange:
        """A handshake-era client's call with its asker, when its answer is a stream it can be asked on."""
        relay = exchange.relay
        if relay is None or not relay.asks or not exchange.declared.answers_on_stream:
            return exchange
        return replace(exchange, asker=StreamAsker(self.indexer, exchange.caller, relay))

    @staticmethod
    def applies(caller: Caller) -> bool:
        """Whether a caller's calls run as rounds: a 2026-07-28 client that can answer something."""
        return not caller.declared.handshake_era and bool(caller.declared.answers_in_results)

    async def run(self, exchange: Exchange, call: Call, failed: Failed | None = None) -> dict[str, Any]:
        """`call` in a task of its own, with an asker of rounds: its result, or the first round's
        input-required result when the backend asks the client first (the call then goes on in its
        task). What a router error after the first round comes to is `failed(error)`: a tool result
        with `isError` by default (a call's), `failed_outcome` for a request answered with a
        JSON-RPC error instead."""
        failed = failed or _tool_result
        if self.running >= MAX_RUNNING:
            return await call(exchange)  # asked nothing: the backend's request is refused, as before
        asker = RoundAsker(self, exchange.caller)
        failure: list[BaseException] = []
        scope = anyio.CancelScope()

        async def body() -> None:
            self.running += 1
            try:
                with scope:
                    try:
                        result = await call(replace(exchange, asker=asker))
                    except RouterError as exc:
                        if not asker.first.is_set():
                            failure.append(exc)
                            return
                        result = failed(exc)
                    if asker.first.is_set():
                        await asker.done(result)
                    else:
                        asker.answer = result
            except Exception as exc:  # the client's request gets it, as it would without the task
                if not asker.first.is_set():
                    failure.append(exc)
                else:
                    logger.exception("a call waiting for its client's input failed")
                    await asker.done(_failed())
            finally:
                self.running -= 1
                asker.first.set()

        self._group.start_soon(body)
        try:
            await asker.first.wait()
        except BaseException:
            if asker.answer is None:
                scope.cancel()  # the client went before anything was asked: so does the call
            raise
        if failure:
            raise failure[0]
        if asker.answer is None:  # the call's task was cancelled: the router stops
            raise RouterStopping("the router stopped before this call finished: call the tool again")
        return asker.answer

    async def resume(self, caller: Caller, retry: Mapping[str, Any]) -> dict[str, Any] | None:
        """A client's retry of a round the router made: the answers passed on, and what the call came
        to; None when its request state is not the router's. Raises `InvalidRequestState` for a
        retry that names no round of this session or does not answer it, `BackendError` when the
        call did not finish in time or its backend is not reachable."""
        state = retry.get("requestState")
        if not isinstance(state, str) or not state.startswith(STATE_PREFIX):
            return None
        token = state[len(STATE_PREFIX) :]
        record = await self._read(caller, token)
        within = record.get("within")
        if record.get("state") == "asked":
            if (again := _asked_again(record, retry.get("inputResponses"), state)) is not None:
                return again
            await self._answer(caller, record, retry.get("inputResponses"))
        with anyio.move_on_after((within if isinstance(within, int | float) else 0.0) + KEPT_AFTER):
            wait = POLL_FIRST
            while record.get("state") != "done":
                await anyio.sleep(wait)
                wait = min(wait * 2, POLL_LAST)
                record = await self._read(caller, token)
            outcome = record.get("outcome")
            if isinstance(outcome, dict):
                return outcome
        raise BackendError(
            str(record.get("backend")),
            "did not finish the call these answers are for in time: call the tool again",
        )

    async def _read(self, caller: Caller, token: str) -> dict[str, Any]:
        record = await self.indexer.read_input_round(caller.session_id, caller.identity.principal, token)
        if record is None:
            raise InvalidRequestState(
                "requestState names no call that waits for input in this session (it ended, it is "
                "another session's, or it was altered): call the tool again without it"
            )
        return record

    async def _answer(self, caller: Caller, record: Mapping[str, Any], responses: object) -> None:
        """Post the client's answers to the backend's requests, inside the session they wait in."""
        requests = record.get("requests")
        backend_id = record.get("backend")
        session = record.get("session")
        if not isinstance(requests, dict) or not isinstance(backend_id, str) or not isinstance(session, list):
            raise InvalidRequestState(
                "requestState names a round this router cannot read: call the tool again"
            )
        if not isinstance(responses, dict):
            raise InvalidRequestState(
                "a retry with requestState carries inputResponses: the answers asked for"
            )
        missing = [key for key in requests if key not in responses]
        if missing:
            raise InvalidRequestState(
                f"inputResponses lacks the answer to {', '.join(missing)}: answer each request"
            )
        reach = await self.indexer.reachable_backends(caller.session_id, caller.identity.principal)
        backend = next((b for b in reach.backends if b.backend_id == backend_id), None)
        if backend is None:
            raise BackendUnavailable(backend_id, "is not reachable now: call the tool again later")
        target = replace(backend.target, session=BackendSession(str(session[0]), str(session[1])))
        timeout = min(target.timeout_seconds, ANSWER_WITHIN)
        for key, request_id in requests.items():
            answer = {"jsonrpc": "2.0", "id": request_id, "result": responses[key]}
            await self.backends.respond(target, answer, caller, timeout)


def _asked_again(record: Mapping[str, Any], responses: object, state: str) -> dict[str, Any] | None:
    """The round's requests whose answers a retry lacks, asked again under the same state, as the
    spec would have a server do; None when it answers them all, or the round kept no copy of them."""
    requests, asked = record.get("requests"), record.get("asked")
    if not isinstance(requests, dict) or not isinstance(asked, dict) or not isinstance(responses, dict):
        return None
    missing = {key: asked[key] for key in requests if key not in responses and key in asked}
    if not missing or len(missing) < sum(1 for key in requests if key not in responses):
        return None
    return {"resultType": "input_required", "inputRequests": missing, "requestState": state}


def _failed() -> dict[str, Any]:
    """What a call that failed in the router after its first round comes to (the failure is logged)."""
    return {"content": [{"type": "text", "text": "the call failed in the router (logged)"}], "isError": True}


def _tool_result(exc: RouterError) -> dict[str, Any]:
    """What a call that failed after its first round comes to, for the client's retry."""
    try:
        return tool_result_for(exc)
    except MCPError:  # an error the router answers as JSON-RPC: the retry gets a tool error instead
        return {"content": [{"type": "text", "text": str(exc)}], "isError": True}
