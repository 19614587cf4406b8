"""How to reach a backend, as the indexer says it and the router's wings pass it on.

The indexer says where a tool or a session's backend lives in three messages (a tool's resolution,
a reachable backend, a session at a backend). It builds each from what its registry knows of the
backend (`BackendState.target`, indexer/backends/registry.py) and writes it to the wire in
indexer/api/messages.py; the router's link reads it back (router/link/backend_targets.py), giving
what an indexer leaves unsaid the router's defaults there and nowhere else. Above the link, the
handlers and the upstream calls take a `BackendTarget` whole: they neither unpack the messages nor
repeat the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolsearch.naming import Prefix
from toolsearch.outgoing import OutgoingAuth
from toolsearch.sessions import BackendSession, Subscription, VersionRef


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


@dataclass(frozen=True, slots=True)
class ResolvedTool:
    """An advertised tool name resolved in a session's current version: the backend's own name for
    the tool ("" if the indexer did not say), its input schema, its backend, and the version the
    name was resolved in."""

    name: str
    original_name: str
    input_schema_json: str
    target: BackendTarget
    version: VersionRef
    # the authorization policy decides a call of it by the call's arguments: asked before calling
    conditional: bool = False

    @property
    def backend_id(self) -> str:
        return self.target.backend_id


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
    authorized: bool = False  # a policy decides which of their prompts and resources the caller may use


@dataclass(frozen=True, slots=True)
class KeptSessions:
    """A client session's backend sessions, each as its backend's target, its subscriptions, and the
    stamp naming both, which a long poll for the next change gives back (`seen`)."""

    stamp: str
    targets: tuple[BackendTarget, ...]
    subscriptions: frozenset[Subscription] = frozenset()
