"""The indexer's answers about backends read into the link's values (toolsearch/targets.py), once.

A tool's resolution (`ResolveToolResponse`), a reachable backend (`ReachableBackend`) and a session
at a backend (`SessionAtBackend`) each say how to reach a backend, in fields of their own. Each is
read here into a `BackendTarget`, and what the indexer leaves unsaid gets the router's default here
and nowhere else: the call timeout (`DEFAULT_BACKEND_TIMEOUT`), the answer's size bound
(`DEFAULT_MAX_RESPONSE_BYTES`), Streamable HTTP, the `Authorization` header, and the naming rule's
`on_collision` with `_`. A session's answer (`SessionAnswer`) carries a resolution too. Above the
link, the router sees no protobuf.
"""

from __future__ import annotations

from typing import NamedTuple

from toolsearch.naming import Prefix
from toolsearch.outgoing import OutgoingAuth
from toolsearch.sections.settings import DEFAULT_BACKEND_TIMEOUT, DEFAULT_MAX_RESPONSE_BYTES
from toolsearch.sessions import BackendSession, Subscription, VersionRef
from toolsearch.targets import (
    BackendTarget,
    KeptSessions,
    ReachableTarget,
    ReachableTargets,
    ResolvedTool,
)
from toolsearch.v1 import indexer_pb2 as pb


def outgoing_auth(auth: pb.BackendAuth) -> OutgoingAuth:
    """A backend's outgoing auth as the indexer sent it."""
    return OutgoingAuth(type=auth.type, header=auth.header or "Authorization", value_env=auth.value_env)


def backend_session_of(kept: pb.BackendSession) -> BackendSession | None:
    """The backend session the indexer keeps for a client session; None where none is kept yet."""
    return BackendSession(kept.session_id, kept.protocol_version) if kept.protocol_version else None


def stored_session(session: BackendSession) -> pb.BackendSession:
    """A backend session as the indexer stores it."""
    return pb.BackendSession(session_id=session.session_id, protocol_version=session.protocol_version)


def _target(found: pb.ResolveToolResponse | pb.ReachableBackend) -> BackendTarget:
    """A backend as a resolution or a reachable backend names it (the same fields in both)."""
    return BackendTarget(
        backend_id=found.backend_id,
        url=found.backend_url,
        auth=outgoing_auth(found.auth),
        protocol_version=found.protocol_version,
        timeout_seconds=found.timeout_seconds or DEFAULT_BACKEND_TIMEOUT,
        max_response_bytes=found.max_response_bytes or DEFAULT_MAX_RESPONSE_BYTES,
        session=backend_session_of(found.backend_session),
    )


def resolved_tool(tool: pb.ResolveToolResponse) -> ResolvedTool:
    """A tool's resolution, its backend read into a target."""
    version = VersionRef(tool.version.number, tool.version.fingerprint)
    return ResolvedTool(
        tool.name, tool.original_name, tool.input_schema_json, _target(tool), version, tool.conditional
    )


class SessionAnswer(NamedTuple):
    """An opened or checked session: its id, the tool its request named (when that resolves), and,
    for a checked one, what its client declared: its log level and its capabilities (JSON)."""

    session_id: str
    tool: ResolvedTool | None
    log_level: str = ""
    capabilities_json: str = ""


def session_answer(answer: pb.OpenSessionResponse | pb.GetSessionResponse) -> SessionAnswer:
    """OpenSession's or GetSession's answer, its resolution (if any) read into a `ResolvedTool`."""
    tool = resolved_tool(answer.tool) if answer.HasField("tool") else None
    if isinstance(answer, pb.GetSessionResponse):
        return SessionAnswer(answer.session_id, tool, answer.log_level, answer.client_capabilities_json)
    return SessionAnswer(answer.session_id, tool)


def reachable_targets(found: pb.ReachableBackendsResponse) -> ReachableTargets:
    """A session's reachable backends, each read into a target, and the naming they follow."""
    backends = tuple(
        ReachableTarget(
            _target(b),
            resources=b.resources,
            prompts=b.prompts,
            completions=b.completions,
        )
        for b in found.backends
    )
    # the indexer's naming of tools; an indexer that says none names them on collision with "_"
    prefix: Prefix = "always" if found.prefix == "always" else "on_collision"
    separator = found.separator if found.prefix else "_"
    return ReachableTargets(backends, prefix, separator, found.authorized)


def session_targets(found: pb.BackendSessionsResponse | pb.SetLogLevelResponse) -> list[BackendTarget]:
    """The backends a client session has a backend session at, each with that session.

    The indexer lists only those with a session id, so each target's `session` is set; the
    indexer says nothing of their protocol, transport or size bound, which a notification inside
    the session does not need.
    """
    return [
        BackendTarget(
            backend_id=entry.backend_id,
            url=entry.backend_url,
            auth=outgoing_auth(entry.auth),
            protocol_version="",
            timeout_seconds=entry.timeout_seconds or DEFAULT_BACKEND_TIMEOUT,
            max_response_bytes=DEFAULT_MAX_RESPONSE_BYTES,
            session=BackendSession(entry.backend_session.session_id, entry.backend_session.protocol_version),
        )
        for entry in found.backends
    ]


def kept_sessions(found: pb.BackendSessionsResponse) -> KeptSessions:
    """A client session's backend sessions as targets, its subscriptions, and the stamp of both."""
    subscriptions = frozenset(Subscription(s.backend_id, s.uri) for s in found.subscriptions)
    return KeptSessions(found.stamp, tuple(session_targets(found)), subscriptions)
