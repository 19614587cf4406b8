"""Requests other than tools/call to the session's reachable backends, inside the client session's
backend sessions: what resources, prompts and completions travel on.

A client request asks the indexer once which backends its session reaches (`ReachableBackends`:
advertised now, with what each offers and the backend session kept there), then sends each backend
what it needs through a `Reach`. A handshake-era backend is asked inside the backend session the
client session keeps there, the same one `call_tool` uses (router/upstream/calls/backends.py), so a stateful
server sees one client: a resource a tool call made in the session can be listed and read. A request
that had to open a backend session (none yet, or the backend forgot it) stores it with the client
session before it is sent in it (router/upstream/calls/session_keeping.py), as a call does, and the
requests after it in the same client request use it; a caller whose session others share keeps
none, and each of its requests runs in a backend session of its own. The handlers reach a
backend's questions of the client across the eras (router/upstream/rounds/) only through here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from mcp.server.context import ServerRequestContext

from router.error_answers import mcp_error
from router.errors import BackendError, ItemDenied, RouterError
from router.exchange import Exchange, exchange_of
from router.link.indexer_client import IndexerClient
from router.upstream.calls.backends import BackendCaller
from router.upstream.rounds.input_rounds import Call, InputRounds, failed_outcome, raise_if_failed
from toolsearch.naming import Prefix
from toolsearch.sessions import BackendSession, Offered, Subscription
from toolsearch.targets import BackendTarget, ReachableTarget, ReachableTargets

logger = logging.getLogger(__name__)

MAX_PAGES = 20  # pages of one listing read from one backend
MAX_ENTRIES = 1000  # entries of one listing kept from one backend: the rest are left out (logged)
MAX_ASKED = 10_000  # items one VisibleItems asks about (the indexer's bound)


def complete(result: Mapping[str, Any]) -> dict[str, Any]:
    """A result as the router answers it: complete (the 2026-07-28 wire requires it to say so), the
    rest as the backend or the aggregation gave it."""
    return {"resultType": "complete", **result}


class BackendRequests:
    """A client request's way to its backends: the indexer asked once for the reachable ones (a
    `Reach`), the backends through `backends`, a backend's questions of the client through `rounds`."""

    def __init__(self, indexer: IndexerClient, backends: BackendCaller) -> None:
        self.indexer = indexer
        self.backends = backends
        # where a 2026-07-28 client's requests a backend may ask during run (the app sets it)
        self.rounds: InputRounds | None = None

    async def reach(self, exchange: Exchange) -> Reach:
        """The exchange's session's reachable backends; raises the indexer's router errors."""
        caller = exchange.caller
        if not caller.session_id:
            return Reach(self, exchange, ReachableTargets())
        found = await self.indexer.reachable_backends(caller.session_id, caller.identity.principal)
        return Reach(self, exchange, found)

    async def reach_from(self, ctx: ServerRequestContext[Any, Any]) -> Reach:
        """`reach` for a handler's request; a router error becomes the JSON-RPC error it answers."""
        try:
            return await self.reach(exchange_of(ctx))
        except RouterError as exc:
            raise mcp_error(exc) from None

    async def calling(self, exchange: Exchange, call: Call) -> dict[str, Any]:
        """A call's work (`call`) for a client that a backend may ask something across the eras: a
        2026-07-28 client's retry of a round the router made answered from that round, its call run
        as input rounds when it can answer (router/upstream/rounds/input_rounds.py), and a
        handshake-era client's answers to a 2026-07-28 backend collected on its call's stream
        (router/upstream/rounds/stream_rounds.py). Raises what `call` raises."""
        rounds = self.rounds
        if rounds is None:
            return await call(exchange)
        resumed = await rounds.resume(exchange.caller, exchange.retry)  # never sent: its state is ours
        if resumed is not None:
            return resumed
        if rounds.applies(exchange.caller):
            return await rounds.run(exchange, call)
        return await call(rounds.on_stream(exchange))


class Reach:
    """One client request's way to its session's reachable backends, and the backend sessions it used.

    Requests to one backend go one after the other (a listing's pages, then the read): the first to
    open a backend session leaves it here for the next.
    """

    def __init__(self, requests: BackendRequests, exchange: Exchange, found: ReachableTargets) -> None:
        self._requests = requests
        self.exchange = exchange
        self.backends: list[ReachableTarget] = list(found.backends)
        # the indexer's naming of tools (its defaults applied by the link)
        self.prefix: Prefix = found.prefix
        self.separator = found.separator
        self.authorized = found.authorized  # a policy decides which prompts and resources it may use
        self._sessions: dict[str, BackendSession | None] = {}

    def offering(self, what: str) -> list[ReachableTarget]:
        """The backends that declared `what` (resources, prompts, completions) in their capabilities."""
        return [b for b in self.backends if getattr(b, what)]

    async def visible(self, items: Sequence[Offered]) -> list[bool]:
        """Which of the items the caller may see (each, without a policy), asked of the indexer."""
        if not self.authorized:
            return [True] * len(items)
        caller = self.exchange.caller
        seen: list[bool] = []
        try:
            for start in range(0, len(items), MAX_ASKED):
                batch = items[start : start + MAX_ASKED]
                principal = caller.identity.principal
                seen += await self._requests.indexer.visible_items(caller.session_id, principal, batch)
        except RouterError as exc:
            raise mcp_error(exc) from None
        return seen

    async def permits(self, item: Offered, arguments: Mapping[str, Any] | None = None) -> bool:
        """Whether the caller may get this prompt or read this resource (with these arguments): False
        when the policy denies it, which the handler answers as it answers an unknown one."""
        if not self.authorized:
            return True
        caller = self.exchange.caller
        try:
            await self._requests.indexer.authorize_call(
                caller.session_id, caller.identity.principal, item, arguments or {}
            )
        except ItemDenied:
            return False  # recorded by the indexer, and in the access line (its policies, no name)
        except RouterError as exc:
            raise mcp_error(exc) from None
        return True

    def refuses_sessions(self, backend: ReachableTarget) -> bool:
        """Whether the backend speaks 2026-07-28 only: it refused a handshake session, where a
        subscription would live, and keeps none of the client's."""
        target = self._target(backend)
        return target.session is None and self._requests.backends.refuses_sessions(target)

    async def keep_subscription(self, subscription: Subscription, subscribed: bool) -> None:
        """Keep (or drop) with the client session a subscription at a backend that keeps none: the
        replica holding the session's standalone stream asks the backend for its updates."""
        caller = self.exchange.caller
        await self._requests.indexer.subscribe(
            caller.session_id, caller.identity.principal, subscription, subscribed
        )

    def _target(self, backend: ReachableTarget) -> BackendTarget:
        """The backend's target, with the backend session this request opened there, if it did."""
        target = backend.target
        if self.exchange.caller.shared:  # a shared implied session keeps none: each request opens its own
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
            outcome = await rounds.resume(self.exchange.caller, retry)
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

        async def sent(exchange: Exchange) -> dict[str, Any]:
            return shaped(await self.send(backend, method, params, exchange))

        rounds = self._requests.rounds
        if rounds is None or not rounds.applies(self.exchange.caller):
            return await sent(self.exchange)
        return await rounds.run(self.exchange, sent, failed_outcome)

    async def send(
        self,
        backend: ReachableTarget,
        method: str,
        params: Mapping[str, Any],
        exchange: Exchange | None = None,
    ) -> dict[str, Any]:
        """One request to one backend, for this request's exchange (or the one given, with its
        asker); its result as it came. Raises `BackendError`s."""
        target = self._target(backend)
        outcome = await self._requests.backends.request(target, method, params, exchange or self.exchange)
        if outcome.session is not None and outcome.session != target.session:
            self._sessions[target.backend_id] = outcome.session
        return outcome.result

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
