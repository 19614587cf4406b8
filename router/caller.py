"""Who a request comes from and what the handlers know of it: the types every wing of the router reads.

The front door decides them (router/frontdoor/auth.py authenticates, router/frontdoor/session_layer.py
checks the session); the handlers, the upstream calls and the indexer link only read them, so they
live here, beneath all of them, and nothing below the front door imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from starlette.datastructures import Headers

from router.targets import ResolvedTool

STATE_KEY = "toolsearch.caller"  # where the session layer leaves the `Caller` in scope["state"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: an issuer and a subject. Both empty means anonymous."""

    issuer: str = ""
    subject: str = ""


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller: the principal sessions are bound to, and the token it presented."""

    principal: Principal
    bearer_token: str | None = field(repr=False)  # a credential: kept out of every repr and log


class Authenticator(Protocol):
    """Decides who a request comes from; raises `Unauthenticated` to refuse it (HTTP 401)."""

    async def authenticate(self, headers: Headers) -> Identity: ...


@dataclass(frozen=True, slots=True)
class Caller:
    """What the tool handlers know about the request in hand."""

    identity: Identity
    session_id: str  # empty when the request needs no session (2026-07-28 `tools/list`, discovery)
    streamed: bool = False  # answered as an SSE stream: notifications may go before the result
    # the tool a call_tool names, resolved with the session check; None: resolve it when needed
    resolved: ResolvedTool | None = None
    # the session is one that callers who may be different people share (the implied session of a
    # principal the router did not verify): it keeps no backend sessions
    shared: bool = False
