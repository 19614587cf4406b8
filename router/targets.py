"""How to reach a backend, as the router's wings pass it on: one value per boundary, no protobuf.

The indexer says where a tool or a session's backend lives in three messages (a tool's resolution,
a reachable backend, a session at a backend). The indexer link (router/link/backend_targets.py)
reads each into a `BackendTarget` once, with the defaults applied there, and the handlers and the
upstream calls take that value whole: they neither unpack the messages nor repeat the defaults.
The values live here, beneath the link, so every wing above it can name them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from toolsearch.naming import Prefix
from toolsearch.outgoing import OutgoingAuth


class BackendSession(NamedTuple):
    """A session at one backend: its `Mcp-Session-Id` ("" for a backend that issues none) and the
    protocol version it negotiated."""

    session_id: str
    protocol_version: str


@dataclass(frozen=True, slots=True)
class BackendTarget:
    """One backend as a request reaches it: where, with which credentials, under which bounds.

    `protocol_version` is what the backend spoke at discovery ("" if unknown); `session` is the
    client session's backend session there, kept in the indexer (None where none is kept yet).
    """

    backend_id: str
    url: str
    auth: OutgoingAuth
    protocol_version: str
    timeout_seconds: float
    max_response_bytes: int
    session: BackendSession | None


class Subscription(NamedTuple):
    """A client's subscription to a resource of a backend that keeps none itself (one the router
    speaks 2026-07-28 to), under the backend's own URI."""

    backend_id: str
    uri: str


@dataclass(frozen=True, slots=True)
class KeptSessions:
    """A client session's backend sessions, each as its backend's target, its subscriptions, and the
    stamp naming both, which a long poll for the next change (`IndexerClient.kept_sessions`) gives
    back."""

    stamp: str
    targets: tuple[BackendTarget, ...]
    subscriptions: frozenset[Subscription] = frozenset()


@dataclass(frozen=True, slots=True)
class ResolvedTool:
    """An advertised tool name resolved in a session: the backend's own name, its schema, its backend."""

    name: str
    original_name: str  # the backend's own name for the tool ("" if the indexer did not say)
    input_schema_json: str
    target: BackendTarget


@dataclass(frozen=True, slots=True)
class ReachableTarget:
    """A backend a session reaches beside its tools, and what its initialize result declared."""

    target: BackendTarget
    resources: bool = False
    prompts: bool = False
    completions: bool = False

    @property
    def backend_id(self) -> str:
        return self.target.backend_id


@dataclass(frozen=True, slots=True)
class ReachableTargets:
    """A session's reachable backends (in backend id order), and the indexer's naming of tools,
    which resources and prompts follow too (toolsearch/naming.py)."""

    backends: tuple[ReachableTarget, ...] = ()
    prefix: Prefix = "on_collision"
    separator: str = "_"
