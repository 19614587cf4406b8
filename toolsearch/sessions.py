"""What names a session and what it keeps, as both sides of the link know it.

The router sends its caller's `Principal` with every request and the indexer binds the session to
it; the indexer says which index version a session is on (`VersionRef`), and keeps for every
router replica the session's backend sessions (`BackendSession`), its client's subscriptions at
backends that keep none (`Subscription`), its client's log level (one of `LOG_LEVELS`), and what
the router keeps under an id of its own (`KEPT_ID`). A session is opened with the claims of its
caller's verified token (`Claims`), which the authorization policy reads; what the router lists from
backends is asked of the policy item by item (`Offered`). The router's link (router/link/) reads the
wire into these values and the indexer's api (indexer/api/messages.py) writes them to it: a field
added crosses the proto, the value here and those two translators, nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple, get_args

from mcp_types import LoggingLevel

LOG_LEVELS: tuple[str, ...] = get_args(LoggingLevel)  # MCP's eight, least severe first
# the id the router gives what it keeps with a session in the indexer (a call's stream, an input
# round): url-safe random, 16 to 64 characters; the indexer refuses any other
KEPT_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")


class Principal(NamedTuple):
    """Who is calling, as the router verified it: an issuer and a subject. Both empty is anonymous."""

    issuer: str = ""  # empty when the router verified nobody (anonymous, or an unverified token holder)
    subject: str = ""


# the claims of a caller's verified token, as the router verified them (empty: it verified nobody)
Claims = Mapping[str, Any]
MAX_CLAIMS_BYTES = 64 * 1024  # a token's claims as JSON, at most: a token is a header, not a document

OfferedKind = Literal["tool", "prompt", "resource"]


class Offered(NamedTuple):
    """A tool, prompt or resource of a backend, as the session names it (a resource by its URI)."""

    kind: OfferedKind
    name: str
    backend_id: str


class VersionRef(NamedTuple):
    """Which index version a session is on: its number (one more per swap) and its fingerprint."""

    number: int
    fingerprint: str


class BackendSession(NamedTuple):
    """A client session's session at one backend: its `Mcp-Session-Id` ("" for a backend that issues
    none) and the protocol version it negotiated."""

    session_id: str
    protocol_version: str


class Subscription(NamedTuple):
    """A client's subscription to a resource of a backend that keeps none itself (one the router
    speaks 2026-07-28 to), under the backend's own URI."""

    backend_id: str
    uri: str
