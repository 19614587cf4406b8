"""The indexer's values as the protobuf messages the router reads, and back: the wire format stays
out of the models, and the gRPC servicer (indexer/api/service.py) only calls these.

The flows answer in the values both sides of the link know (toolsearch/found.py, targets.py,
sessions.py, kept_streams.py: the finder a `Found`, the resolver a `ResolvedTool`, the reachable
backends `ReachableTargets`); this module alone gives them their wire form, and the router's link
(router/link/) reads it back into the same values.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, cast, get_args

from indexer.backends.registry import BackendState
from indexer.errors import InvalidRequest, ToolNotFound
from indexer.retrieval.allowed import catalog_fingerprint
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.index import IndexVersion
from indexer.retrieval.tools import Tool
from indexer.sessions.views import LiveSession
from indexer.state import SessionRecord
from indexer.state.stream_events import check_keep
from toolsearch.found import Found
from toolsearch.kept_streams import EventsToKeep, KeptEvents, StreamEnd
from toolsearch.outgoing import OutgoingAuth
from toolsearch.sessions import (
    MAX_CLAIMS_BYTES,
    BackendSession,
    Offered,
    OfferedKind,
    Principal,
    VersionRef,
)
from toolsearch.targets import BackendTarget, KeptSessions, ReachableTargets, ResolvedTool
from toolsearch.v1 import indexer_pb2 as pb

MAX_CAPABILITIES = 65_536  # characters of a client's declared capabilities a session keeps
OFFERED_KINDS: tuple[str, ...] = get_args(OfferedKind)


def checked_capabilities(declared: str) -> str:
    """A client's declared capabilities as a session keeps them: a JSON object, or "" for none."""
    if not declared:
        return ""
    if len(declared) > MAX_CAPABILITIES:
        raise InvalidRequest(
            f"a client's capabilities are at most {MAX_CAPABILITIES} characters of JSON: declare fewer"
        )
    try:
        decoded = json.loads(declared)
    except ValueError:
        raise InvalidRequest("a client's capabilities must be a JSON object") from None
    if not isinstance(decoded, dict):
        raise InvalidRequest("a client's capabilities must be a JSON object")
    return declared


def checked_claims(principal: Principal, claims: str) -> str:
    """A verified caller's claims as a session keeps them: a JSON object (canonical, so that equal
    claims are equal text), or "" for a caller nobody verified, whatever it sent."""
    if not claims or not principal.issuer:
        return ""
    if len(claims.encode()) > MAX_CLAIMS_BYTES:
        raise InvalidRequest(f"a caller's claims are at most {MAX_CLAIMS_BYTES} bytes of JSON")
    try:
        decoded = json.loads(claims)
    except ValueError:
        raise InvalidRequest("a caller's claims must be a JSON object") from None
    if not isinstance(decoded, dict):
        raise InvalidRequest("a caller's claims must be a JSON object")
    return json.dumps(decoded, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def checked_arguments(arguments: str) -> dict[str, Any]:
    """A call's arguments as the policy reads them: a JSON object ({} for none)."""
    if not arguments:
        return {}
    try:
        decoded = json.loads(arguments)
    except ValueError:
        raise InvalidRequest("a call's arguments must be a JSON object") from None
    if not isinstance(decoded, dict):
        raise InvalidRequest("a call's arguments must be a JSON object")
    return decoded


def offered_of(message: pb.Offered) -> Offered:
    """An item the router asks about; raises `InvalidRequest` for a kind the policy has no action for."""
    if message.kind not in OFFERED_KINDS:
        raise InvalidRequest(f"an item is a tool, a prompt or a resource, not {message.kind[:40]!r}")
    return Offered(cast("OfferedKind", message.kind), message.name, message.backend_id)


def suggestions(exc: ToolNotFound) -> pb.ToolSuggestions:
    return pb.ToolSuggestions(
        suggestions=[
            pb.ToolSuggestion(name=name, backend_id=backend, server_title=title)
            for name, backend, title in exc.suggestions
        ],
        reason=exc.reason,
    )


def backend_auth(auth: OutgoingAuth) -> pb.BackendAuth:
    return pb.BackendAuth(type=auth.type, header=auth.header, value_env=auth.value_env or "")


def backend_session(session: BackendSession | None) -> pb.BackendSession:
    if session is None:
        return pb.BackendSession()
    return pb.BackendSession(session_id=session.session_id, protocol_version=session.protocol_version)


def principal_of(message: pb.Principal) -> Principal:
    return Principal(message.issuer, message.subject)


def ref(version: VersionRef) -> pb.IndexVersionRef:
    return pb.IndexVersionRef(number=version.number, fingerprint=version.fingerprint)


def version_ref(session: LiveSession) -> pb.IndexVersionRef:
    current = session.current
    return pb.IndexVersionRef(number=current.number, fingerprint=current.fingerprint)


def find_tools_response(found: Found) -> pb.FindToolsResponse:
    """A find_tool answer (`Finder.find`) as `FindTools` returns it."""
    metrics = found.token_metrics
    return pb.FindToolsResponse(
        version=ref(found.version),
        tools=[
            pb.FoundTool(
                name=tool.name,
                backend_id=tool.backend_id,
                definition_json=tool.definition_json,
                score=tool.score,
                server_title=tool.server_title,
                server_description=tool.server_description,
                match=tool.match,
                relevance=tool.relevance,
            )
            for tool in found.tools
        ],
        unavailable=[
            pb.UnavailableBackend(
                id=backend.backend_id, status=backend.status, server_title=backend.server_title
            )
            for backend in found.unavailable
        ],
        token_metrics=pb.TokenMetrics(
            baseline_tokens=metrics.baseline_tokens,
            returned_tokens=metrics.returned_tokens,
            savings_percent=metrics.savings_percent,
        ),
        empty_reason=found.empty_reason,
        note=found.note,
    )


def resolve_tool_response(resolved: ResolvedTool) -> pb.ResolveToolResponse:
    """A resolved name (`ToolResolver.resolve`) as `ResolveTool`, `GetSession` and `OpenSession` carry it."""
    target = resolved.target
    return pb.ResolveToolResponse(
        name=resolved.name,
        original_name=resolved.original_name,
        backend_id=target.backend_id,
        backend_url=target.url,
        input_schema_json=resolved.input_schema_json,
        auth=backend_auth(target.auth),
        version=ref(resolved.version),
        protocol_version=target.protocol_version,
        timeout_seconds=target.timeout_seconds,
        max_response_bytes=target.max_response_bytes,
        backend_session=backend_session(target.session),
        conditional=resolved.conditional,
    )


def reachable_backends_response(reachable: ReachableTargets) -> pb.ReachableBackendsResponse:
    """A session's reachable backends (`reachable_targets`) as `ReachableBackends` returns them."""
    return pb.ReachableBackendsResponse(
        prefix=reachable.prefix,
        separator=reachable.separator,
        authorized=reachable.authorized,
        backends=[
            pb.ReachableBackend(
                backend_id=entry.backend_id,
                backend_url=entry.target.url,
                protocol_version=entry.target.protocol_version,
                auth=backend_auth(entry.target.auth),
                timeout_seconds=entry.target.timeout_seconds,
                max_response_bytes=entry.target.max_response_bytes,
                backend_session=backend_session(entry.target.session),
                resources=entry.resources,
                prompts=entry.prompts,
                completions=entry.completions,
            )
            for entry in reachable.backends
        ],
    )


def session_at_backend(target: BackendTarget) -> pb.SessionAtBackend:
    """A backend session and how to reach its backend; the message says nothing of the backend's
    protocol or its answers' bound, which a notification inside the session does not need."""
    return pb.SessionAtBackend(
        backend_id=target.backend_id,
        backend_url=target.url,
        auth=backend_auth(target.auth),
        backend_session=backend_session(target.session),
        timeout_seconds=target.timeout_seconds,
    )


def backend_sessions_response(kept: KeptSessions) -> pb.BackendSessionsResponse:
    """The backend sessions a session keeps, with its subscriptions and the stamp of the whole
    (`indexer.sessions.backend_session_waits`), as `BackendSessions` returns them."""
    return pb.BackendSessionsResponse(
        stamp=kept.stamp,
        subscriptions=[pb.Subscription(backend_id=b, uri=u) for b, u in sorted(kept.subscriptions)],
        backends=[session_at_backend(target) for target in kept.targets],
    )


def pinned_tools(tools: Sequence[Tool]) -> pb.PinnedToolsResponse:
    return pb.PinnedToolsResponse(
        tools=[
            pb.FoundTool(name=t.name, backend_id=t.backend_id, definition_json=t.definition_json)
            for t in tools
        ]
    )


def backend_status(state: BackendState) -> pb.BackendStatus:
    health = state.health
    return pb.BackendStatus(
        id=state.config.id,
        url=state.config.url,
        status=health.status,
        tool_count=len(state.listing.tools) if state.listing else 0,
        latency_ms=health.latency * 1000,
        last_error=health.last_error,
        consecutive_failures=health.consecutive_failures,
        circuit=health.circuit,
    )


def session_status(session: SessionRecord) -> pb.SessionStatus:
    """A session as `toolsearch status` shows it: its id's start, principal, version, backends, swaps."""
    status = pb.SessionStatus(
        session_id=session.id[:8],
        principal=pb.Principal(issuer=session.principal.issuer, subject=session.principal.subject),
        version=ref(session.ref),
        backends=sorted(session.accepted),
        rejected_backends=sorted(session.rejected_at_creation),
    )
    for swap in session.swaps:
        status.swaps.append(
            pb.SwapRecord(
                previous=ref(swap.previous) if swap.previous else None,
                current=ref(swap.current),
                reason=swap.reason,
                at_unix=swap.at,
            )
        )
    return status


_STREAM_ENDS = {
    StreamEnd.OPEN: pb.STREAM_END_OPEN,
    StreamEnd.DONE: pb.STREAM_END_DONE,
    StreamEnd.BROKEN: pb.STREAM_END_BROKEN,
}


def events_to_keep(request: pb.KeepStreamEventsRequest) -> EventsToKeep:
    """The keep a router asks for; raises `InvalidRequest` for one it would not make."""
    ends = {wire: end for end, wire in _STREAM_ENDS.items()}
    if request.end not in ends:
        raise InvalidRequest(f"unknown stream end: {request.end}")
    keep = EventsToKeep(
        request.session_id,
        request.stream_id,
        request.first_seq,
        tuple(request.events),
        ends[request.end],
        request.ttl_seconds,
        request.request_id_json,
    )
    check_keep(keep)
    return keep


def read_stream_events_response(kept: KeptEvents | None) -> pb.ReadStreamEventsResponse:
    if kept is None:
        return pb.ReadStreamEventsResponse(found=False)
    return pb.ReadStreamEventsResponse(
        found=True, events=kept.events, end=_STREAM_ENDS[kept.end], request_id_json=kept.request_id
    )


def status(
    embeddings: Embeddings,
    backends: Iterable[BackendState],
    sessions: Sequence[SessionRecord],
    versions: Iterable[IndexVersion],
) -> pb.StatusResponse:
    """`Status`: the model and its counters, every backend, every live session, every version kept."""
    outage = embeddings.outage
    response = pb.StatusResponse(
        model=embeddings.identity,
        embedding=pb.EmbeddingCounters(
            model_calls=embeddings.model_calls,
            texts_embedded=embeddings.texts_embedded,
            cache_hits=embeddings.cache_hits,
            embedder=str(getattr(embeddings.embedder, "kind", "")),
            unavailable=outage is not None and outage.down,
            unavailable_reason=outage.reason if outage is not None else "",
            unavailable_since_unix=(outage.since or 0.0) if outage is not None else 0.0,
            outages=outage.outages if outage is not None else 0,
            lexical_answers=outage.lexical_answers if outage is not None else 0,
        ),
    )
    response.backends.extend(backend_status(state) for state in backends)
    response.sessions.extend(session_status(session) for session in sessions)
    shared = Counter(catalog_fingerprint(session.ref.fingerprint) for session in sessions)
    response.versions.extend(
        pb.VersionStatus(fingerprint=v.fingerprint, tool_count=len(v.tools), sessions=shared[v.fingerprint])
        for v in versions
    )
    return response
