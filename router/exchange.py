"""`Exchange`: one client request as the backends it reaches see it.

Everything a request to a backend needs besides its target travels as this one value: who asks and
in which session (`Caller`: the identity its credentials come from, what the client declared of
itself), the client's JSON-RPC id (a call goes to its backend under an id made of it, so a
cancellation that reaches any replica names it too), the stream it is answered on, what a retry of
an input-required call carries back to its backend, the relay that passes what a backend streams on
to the client, and the asker that carries a backend's questions across the protocol eras.
`BackendCaller.call_tool(target, name, arguments, exchange)` and `request(target, method, params,
exchange)` (router/upstream/calls/backends.py) are the ways to a backend; the wire reads from the
exchange what it offers a backend and where a backend's messages go.

The session layer makes it where the request enters (router/frontdoor/session_layer.py), and leaves
it in the request's scope for the handler; the handler binds the relay (`exchange_of`: the SDK's
context is the handler's) and, for a call, its retry, and the rounds (router/upstream/rounds/) the
asker of a call they run. It is frozen: each of those is a new exchange (`dataclasses.replace`), so
one made for a call never changes under another.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, RequestId

from router.caller import ANSWERABLE, STATE_KEY, Caller, Declared, Identity
from router.relays import ClientStream, NotificationRelay
from toolsearch.sessions import BackendSession, Principal


def backend_request_id(client_request_id: str | int) -> str:
    """The id a call is sent to its backend with, known from the client's own id alone.

    So the client's cancellation, whichever replica it reaches, can name the backend's request.
    """
    return f"toolsearch:{json.dumps(client_request_id)}"


class Asker(Protocol):
    """How a request asks its client what its backend asks across the two eras, with input-required
    rounds (router/upstream/rounds/): one implementation for each kind of client."""

    async def ask(
        self, backend_id: str, session: BackendSession, request: Mapping[str, Any], within: float
    ) -> bool:
        """Ask a 2026-07-28 client `request`, which waits in the handshake-era backend `session` for
        at most `within` seconds; False when it cannot go."""
        ...

    async def collect(
        self, backend_id: str, requests: Mapping[str, Any], within: float
    ) -> dict[str, Any] | None:
        """A handshake-era client's answers to a 2026-07-28 backend's `requests` (key: request),
        asked on the request's stream and waited for at most `within` seconds; None when they
        cannot be asked."""
        ...


@dataclass(frozen=True, slots=True)
class Exchange:
    """One client request, for the backends it reaches."""

    caller: Caller
    request_id: RequestId | None = None  # the client's JSON-RPC id; None for a notification's work
    # the SSE stream the request is answered on, where what comes before the result goes (the
    # relay's, a backend's requests of the client); None when the answer is JSON
    stream: ClientStream | None = field(default=None, compare=False)
    # a 2026-07-28 client's retry of an input-required call: `inputResponses`, `requestState`
    retry: Mapping[str, Any] = field(default_factory=dict)
    relay: NotificationRelay | None = field(default=None, compare=False)  # None: answered as JSON
    asker: Asker | None = field(default=None, compare=False)  # None: asked nothing across the eras

    @property
    def declared(self) -> Declared:
        return self.caller.declared

    @property
    def call_id(self) -> str | None:
        """The id a call goes to its backend with (`backend_request_id`); None without a client id."""
        return backend_request_id(self.request_id) if self.request_id is not None else None

    @property
    def log_floor(self) -> str | None:
        """The lowest level of log messages a backend is to send during the request; None: none."""
        return self.relay.log_floor if self.relay is not None else None

    @property
    def offered_in_session(self) -> dict[str, Any]:
        """What a handshake session a backend opens for the request is told the client answers: on
        the request's stream, or as an input round when the request can ask its client so."""
        declared = self.declared
        return declared.answers_on_stream or (declared.answers_in_results if self.asker is not None else {})

    @property
    def offered_per_request(self) -> dict[str, Any]:
        """What a 2026-07-28 request to a backend says the client answers: a 2026-07-28 client's
        own, or a handshake-era one's when its answers can be collected on its stream."""
        declared = self.declared
        return declared.answers_in_results or (declared.answers_on_stream if self.asker is not None else {})

    async def forward(self, message: Mapping[str, Any]) -> None:
        """Pass on a backend's notification during the request, if the client takes it."""
        if self.relay is not None:
            await self.relay.forward(message)

    async def pass_on(
        self, backend_id: str, session: BackendSession | None, request: Mapping[str, Any], within: float
    ) -> bool:
        """Pass a backend's request of its client on, if the client can answer it: on the request's
        stream (a handshake-era client), or as an input round (a 2026-07-28 one, `within` seconds)."""
        needs = ANSWERABLE.get(str(request.get("method", "")))
        if needs is None:
            return False
        if self.relay is not None and needs in self.declared.answers_on_stream:
            return await self.relay.ask(backend_id, request)
        if self.asker is not None and session is not None and needs in self.declared.answers_in_results:
            return await self.asker.ask(backend_id, session, request, within)
        return False


# what a request of the router's own carries of a client (a notice passed on, an answer, a listen,
# a session's end): nobody, nothing declared, nothing relayed, nothing asked
BARE = Exchange(Caller(Identity(Principal(), None), ""))


def exchange_of(ctx: ServerRequestContext[Any, Any]) -> Exchange:
    """The exchange the session layer made for the request a handler answers, with the relay of
    its stream when it is answered as one."""
    request = ctx.request
    exchange = request.scope.get("state", {}).get(STATE_KEY) if request is not None else None
    if not isinstance(exchange, Exchange):
        raise MCPError(INTERNAL_ERROR, "request did not come through the session layer")
    if exchange.stream is None:
        return exchange
    token = (ctx.meta or {}).get("progress_token")
    relay = NotificationRelay(ctx, token, exchange.declared.log_floor, exchange.stream)
    return replace(exchange, relay=relay)
