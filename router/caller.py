"""Who a request comes from and what the handlers know of it: the types every wing of the router reads.

The front door decides them (router/frontdoor/auth.py authenticates, router/frontdoor/session_layer.py
checks the session); the handlers, the upstream calls and the indexer link only read them, so they
live here, beneath all of them, and nothing below the front door imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.datastructures import Headers

from toolsearch.sessions import Claims, Principal
from toolsearch.targets import ResolvedTool

# where the session layer leaves a request's `Exchange` (router/exchange.py) in scope["state"]
STATE_KEY = "toolsearch.caller"
# a backend's requests of its client the router relays, by the client capability each needs
ANSWERABLE = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller: the principal sessions are bound to, the token it presented, and the
    claims of that token as the router verified them (none when it verified nobody), which the
    indexer's authorization policy reads."""

    principal: Principal
    bearer_token: str | None = field(repr=False)  # a credential: kept out of every repr and log
    claims: Claims = field(default_factory=dict, repr=False, compare=False)


class Authenticator(Protocol):
    """Decides who a request comes from; raises `Unauthenticated` to refuse it (HTTP 401)."""

    async def authenticate(self, headers: Headers) -> Identity: ...


@dataclass(frozen=True, slots=True)
class Declared:
    """What the client said of itself that backends' requests depend on.

    A handshake-era client says it once (its capabilities at initialize, its level with
    logging/setLevel), and the indexer keeps it with the session; a 2026-07-28 client says it in
    each request's `_meta`.
    """

    capabilities: Mapping[str, Any] | None = None  # None: the client said nothing of them
    log_level: str = ""  # the lowest level of log messages it asked for; "" for none
    # without a level, the client takes no log messages (2026-07-28: logs are asked for per
    # request); else it takes all of them (the handshake era leaves the choice to the server)
    quiet_unasked: bool = False

    @property
    def log_floor(self) -> str | None:
        """The lowest level of log messages to pass on to this client; None for none at all."""
        if self.log_level:
            return self.log_level
        return None if self.quiet_unasked else "debug"

    @property
    def session_level(self) -> str:
        """The level the client set for its whole session ("" for none; a 2026-07-28 client's level
        is its request's alone)."""
        return "" if self.quiet_unasked else self.log_level

    def lacks(self, capability: str) -> bool:
        """Whether the client is known not to have declared `capability` (unknown: it is not)."""
        return self.capabilities is not None and capability not in self.capabilities

    @property
    def handshake_era(self) -> bool:
        """Whether the client speaks the handshake era (a 2026-07-28 client declares per request)."""
        return not self.quiet_unasked

    @property
    def answers_on_stream(self) -> dict[str, Any]:
        """What a backend may ask a handshake-era client through the router: its sampling,
        elicitation and roots, whose requests reach it on a call's stream (router/relays.py).
        None for a 2026-07-28 client, which takes no request on a stream."""
        return {} if self.quiet_unasked else self._answerable()

    @property
    def answers_in_results(self) -> dict[str, Any]:
        """What a 2026-07-28 backend may ask a 2026-07-28 client: its sampling, elicitation and roots,
        asked by an input-required result that reaches the client as the backend gave it. None for
        a handshake-era client, which would not know such a result."""
        return self._answerable() if self.quiet_unasked else {}

    def _answerable(self) -> dict[str, Any]:
        if self.capabilities is None:
            return {}
        return {name: self.capabilities[name] for name in ANSWERABLE.values() if name in self.capabilities}


NOTHING_DECLARED = Declared()


@dataclass(frozen=True, slots=True)
class Caller:
    """Who the request in hand comes from, in which session, and what the client declared."""

    identity: Identity
    session_id: str  # empty when the request needs no session (2026-07-28 `tools/list`, discovery)
    # the tool a call_tool names, resolved with the session check; None: resolve it when needed
    resolved: ResolvedTool | None = None
    # the session is one that callers who may be different people share (the implied session of a
    # principal the router did not verify): it keeps no backend sessions
    shared: bool = False
    declared: Declared = NOTHING_DECLARED  # what the client said of itself
