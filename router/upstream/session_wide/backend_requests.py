"""Requests other than tools/call to the session's reachable backends, inside the client session's
backend sessions: what resources, prompts and completions travel on.

A client request asks the indexer once which backends its session reaches (`ReachableBackends`:
advertised now, with what each offers and the backend session kept there), then sends each backend
what it needs through a `Reach`. A handshake-era backend is asked inside the backend session the
client session keeps there, the same one `call_tool` uses (router/handlers/tool_calls.py), so a stateful
server sees one client: a resource a tool call made in the session can be listed and read. A request
that had to open a backend session (none yet, or the backend forgot it) stores it with the client
session before it is sent in it (router/upstream/calls/session_keeping.py), as a call does, and the
requests after it in the same client request use it; a caller whose session others share keeps
none, and each of its requests runs in a backend session of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

from router.caller import STATE_KEY, Caller
from router.error_answers import mcp_error
from router.errors import BackendError, RouterError
from router.link.indexer_client import IndexerClient
from router.upstream.calls.backends import BackendCaller
from router.upstream.calls.credentials import OutgoingCredentials
from router.upstream.calls.session_keeping import SessionKeeper
from router.upstream.calls.session_notes import noted_result
from router.upstream.rounds.input_rounds import InputRounds, failed_outcome, raise_if_failed
from router.upstream.wire.relays import ClientAsker, NotificationRelay
from toolsearch.naming import Prefix
from toolsearch.sessions import BackendSession, Subscription
from toolsearch.targets import BackendTarget, ReachableTarget, ReachableTargets

logger = logging.getLogger(__name__)

MAX_PAGES = 20  # pages of one listing read from one backend
MAX_ENTRIES = 1000  # entries of one listing kept from one backend: the rest are left out (logged)


def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
    """The caller the session layer identified for the request in hand."""
    request = ctx.request
    caller = request.scope.get("state", {}).get(STATE_KEY) if request is not None else None
    if not isinstance(caller, Caller):
        raise MCPError(INTERNAL_ERROR, "request did not come through the session layer")
    return caller


def complete(result: Mapping[str, Any]) -> dict[str, Any]:
    """A result as the router answers it: complete (the 2026-07-28 wire requires it to say so), the
    rest as the backend or the aggregation gave it."""
    return {"resultType": "complete", **result}


class BackendRequests:
    """Opens a `Reach` for a client request: the indexer asked once, the backends through `backends`."""

    def __init__(self, indexer: IndexerClient, backends: BackendCaller, secrets: Mapping[str, str]) -> None:
        self.indexer = indexer
        self.backends = backends
        self.credentials = OutgoingCredentials(indexer, secrets)
        # where a 2026-07-28 client's requests a backend may ask during run (the app sets it)
        self.rounds: InputRounds | None = None

    async def reach(self, caller: Caller) -> Reach:
        """The caller's session's reachable backends; raises the indexer's router errors."""
        if not caller.session_id:
            return Reach(self, caller, ReachableTargets())
        found = await self.indexer.reachable_backends(caller.session_id, caller.identity.principal)
        return Reach(self, caller, found)

    async def reach_from(self, ctx: ServerRequestContext[Any, Any]) -> Reach:
        """`reach` for a handler's request; a router error becomes the JSON-RPC error it answers."""
        caller = caller_of(ctx)
        try:
            reach = await self.reach(caller)
        except RouterError as exc:
            raise mcp_error(exc) from None
        if caller.streamed:  # what the backends send before the result goes on the request's stream
            token = (ctx.meta or {}).get("progress_token")
            reach.relay = NotificationRelay(ctx, token, caller.declared.log_floor, caller.stream)
        return reach


class Reach:
    """One client request's way to its session's reachable backends, and the backend sessions it used.

    Requests to one backend go one after the other (a listing's pages, then the read): the first to
    open a backend session leaves it here for the next.
    """

    def __init__(self, requests: BackendRequests, caller: Caller, found: ReachableTargets) -> None:
        self._requests = requests
        self.caller = caller
        self.backends: list[ReachableTarget] = list(found.backends)
        # the indexer's naming of tools (its defaults applied by the link)
        self.prefix: Prefix = found.prefix
        self.separator = found.separator
        self._sessions: dict[str, BackendSession | None] = {}
        self.relay: NotificationRelay | None = None  # the request's stream to its client, if it has one

    def offering(self, what: str) -> list[ReachableTarget]:
        """The backends that declared `what` (resources, prompts, completions) in their capabilities."""
        return [b for b in self.backends if getattr(b, what)]

    def refuses_sessions(self, backend: ReachableTarget) -> bool:
        """Whether the backend speaks 2026-07-28 only: it refused a handshake session, where a
        subscription would live, and keeps none of the client's."""
        target = self._target(backend)
        return target.session is None and self._requests.backends.refuses_sessions(target)

    async def keep_subscription(self, subscription: Subscription, subscribed: bool) -> None:
        """Keep (or drop) with the client session a subscription at a backend that keeps none: the
        replica holding the session's standalone stream asks the backend for its updates."""
        caller = self.caller
        await self._requests.indexer.subscribe(
            caller.session_id, caller.identity.principal, subscription, subscribed
        )

    def _target(self, backend: ReachableTarget) -> BackendTarget:
        """The backend's target, with the backend session this request opened there, if it did."""
        target = backend.target
        if self.caller.shared:  # a shared implied session keeps none: each request opens its own
            return replace(target, session=None)
        if target.backend_id in self._sessions:
            return replace(target, session=self._sessions[target.backend_id])
        return target

    async def resumed(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """A 2026-07-28 client's retry of a round the router made (`requestState` its own): the
        answers passed on and what the request came to; None for any other request. Raises the
        `MCPError` the request answers when it fails."""
        rounds = self._requests.rounds
        if rounds is None:
            return None
        retry = {key: params[key] for key in ("requestState", "inputResponses") if key in params}
        try:
            outcome = await rounds.resume(self.caller, retry)
        except RouterError as exc:
            raise mcp_error(exc) from None
        return None if outcome is None else raise_if_failed(outcome)

    async def asking(
        self,
        backend: ReachableTarget,
        method: str,
        params: Mapping[str, Any],
        shaped: Callable[[dict[str, Any]], dict[str, Any]] = dict,
    ) -> dict[str, Any]:
        """`send` for a request a backend may ask its client something during (a read, a prompt),
        its result `shaped` as the client is to get it: a 2026-07-28 client that can answer gets
        what a handshake-era backend asks as input rounds, as during a call
        (router/upstream/rounds/input_rounds.py), and a later round's retry the result shaped too."""

        async def sent(asker: ClientAsker | None = None) -> dict[str, Any]:
            return shaped(await self.send(backend, method, params, asker))

        rounds = self._requests.rounds
        if rounds is None or not rounds.applies(self.caller):
            return await sent()
        return await rounds.run(self.caller, sent, failed_outcome)

    async def send(
        self,
        backend: ReachableTarget,
        method: str,
        params: Mapping[str, Any],
        asker: ClientAsker | None = None,
    ) -> dict[str, Any]:
        """One request to one backend; its result as it came. Raises `BackendError`s."""
        requests = self._requests
        caller = self.caller
        target = self._target(backend)
        headers = await requests.credentials.headers(target, caller.identity)
        keeper = SessionKeeper(requests.indexer, requests.backends, caller, target, headers)
        try:
            outcome = await requests.backends.request(
                target,
                method,
                params,
                headers,
                keeper,
                declared=caller.declared,
                relay=self.relay,
                asker=asker,
            )
        finally:
            await keeper.close()
        if outcome.session is not None and outcome.session != target.session:
            self._sessions[target.backend_id] = outcome.session
        return noted_result(outcome.result, keeper.note(outcome.replaced))

    async def list_all(self, backend: ReachableTarget, method: str, field: str) -> list[dict[str, Any]]:
        """Every entry of a paginated listing of one backend, at most `MAX_ENTRIES` of them."""
        entries: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await self.send(backend, method, {"cursor": cursor} if cursor else {})
            listed = page.get(field)
            if not isinstance(listed, list):
                raise BackendError(backend.backend_id, f"answered {method} without a list of {field}")
            entries.extend(entry for entry in listed if isinstance(entry, dict))
            cursor = page.get("nextCursor") if isinstance(page.get("nextCursor"), str) else None
            if not cursor or len(entries) >= MAX_ENTRIES:
                break
        if len(entries) > MAX_ENTRIES or cursor:
            logger.warning(
                "backend %s: %s gave more than %d %s (or %d pages): the rest are left out",
                backend.backend_id,
                method,
                MAX_ENTRIES,
                field,
                MAX_PAGES,
            )
        return entries[:MAX_ENTRIES]
