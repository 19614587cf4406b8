"""The indexer's values as the protobuf messages the router reads, and back: the wire format stays
out of the models, and the gRPC servicer (indexer/api/service.py) only calls these.

The flows answer in plain values (the finder a `Found`, the resolver a `ResolvedTool`, the
reachable backends `ReachableBackend`s); this module alone gives them their wire form.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import get_args

from mcp_types import LoggingLevel

from indexer.api.finder import Found
from indexer.api.reachable import ReachableBackend
from indexer.api.resolution import ResolvedTool
from indexer.backends.registry import BackendState
from indexer.errors import InvalidRequest, ToolNotFound
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.index import IndexVersion
from indexer.retrieval.tools import Tool
from indexer.sessions.views import LiveSession
from indexer.state import BackendSession, Principal, SessionRecord, Subscription, VersionRef
from indexer.state.stream_events import EventsToKeep, KeptEvents, StreamEnd
from toolsearch.sections.backend_settings import Backend
from toolsearch.sections.indexer_settings import Naming
from toolsearch.v1 import indexer_pb2 as pb

LOG_LEVELS: tuple[str, ...] = get_args(LoggingLevel)  # MCP's eight, least severe first
MAX_CAPABILITIES = 65_536  # characters of a client's declared capabilities a session keeps


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


def suggestions(exc: ToolNotFound) -> pb.ToolSuggestions:
    return pb.ToolSuggestions(
        suggestions=[
            pb.ToolSuggestion(name=name, backend_id=backend, server_title=title)
            for name, backend, title in exc.suggestions
        ],
        reason=exc.reason,
    )


def auth(backend: Backend) -> pb.BackendAuth:
    auth = backend.auth
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
    return pb.IndexVersionRef(number=current.number, fingerprint=current.version.fingerprint)


def found(answer: Found) -> pb.FindToolsResponse:
    """A find_tool answer (`Finder.find`) as `FindTools` returns it."""
    response = pb.FindToolsResponse(
        version=ref(answer.version),
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
            for tool in answer.tools
        ],
        unavailable=[
            pb.UnavailableBackend(id=backend.id, status=backend.status, server_title=backend.server_title)
            for backend in answer.unavailable
        ],
        empty_reason=answer.empty_reason,
        note=answer.note,
    )
    metrics = answer.token_metrics
    response.token_metrics.baseline_tokens = metrics.baseline_tokens
    response.token_metrics.returned_tokens = metrics.returned_tokens
    response.token_metrics.savings_percent = metrics.savings_percent
    return response


def resolved_tool(resolved: ResolvedTool) -> pb.ResolveToolResponse:
    """A resolved name (`ToolResolver.resolve`) as `ResolveTool`, `GetSession` and `OpenSession` carry it."""
    tool, backend = resolved.tool, resolved.backend
    return pb.ResolveToolResponse(
        name=tool.name,
        original_name=tool.original_name,
        backend_id=tool.backend_id,
        backend_url=backend.url,
        input_schema_json=tool.input_schema_json,
        auth=auth(backend),
        version=ref(resolved.version),
        protocol_version=resolved.protocol_version,
        timeout_seconds=backend.timeout,
        max_response_bytes=backend.max_response_bytes,
        backend_session=backend_session(resolved.backend_session),
    )


def reachable_backends(reachable: Iterable[ReachableBackend], naming: Naming) -> pb.ReachableBackendsResponse:
    """The backends a session can reach (`reachable_backends`) as `ReachableBackends` returns them."""
    response = pb.ReachableBackendsResponse(prefix=naming.prefix, separator=naming.separator)
    for entry in reachable:
        backend, offers = entry.backend, entry.offers
        response.backends.append(
            pb.ReachableBackend(
                backend_id=entry.backend_id,
                backend_url=backend.url,
                protocol_version=entry.protocol_version,
                auth=auth(backend),
                timeout_seconds=backend.timeout,
                max_response_bytes=backend.max_response_bytes,
                backend_session=backend_session(entry.backend_session),
                resources=offers.resources,
                prompts=offers.prompts,
                completions=offers.completions,
            )
        )
    return response


def sessions_at_backends(
    kept: Mapping[str, tuple[Backend, BackendSession]],
    stamp: str = "",
    subscriptions: Iterable[Subscription] = (),
) -> pb.BackendSessionsResponse:
    """The backend sessions a session keeps (backend id -> its backend and session), in id order,
    with its subscriptions and the stamp of the whole (`indexer.sessions.backend_session_waits`)."""
    return pb.BackendSessionsResponse(
        stamp=stamp,
        subscriptions=[pb.Subscription(backend_id=b, uri=u) for b, u in sorted(subscriptions)],
        backends=[
            pb.SessionAtBackend(
                backend_id=backend_id,
                backend_url=backend.url,
                auth=auth(backend),
                backend_session=backend_session(session),
                timeout_seconds=backend.timeout,
            )
            for backend_id, (backend, session) in sorted(kept.items())
        ],
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
        version=pb.IndexVersionRef(number=session.ref.number, fingerprint=session.ref.fingerprint),
        backends=sorted(session.accepted),
        rejected_backends=sorted(session.rejected_at_creation),
    )
    for swap in session.swaps:
        status.swaps.append(
            pb.SwapRecord(
                previous=pb.IndexVersionRef(
                    number=swap.previous.number, fingerprint=swap.previous.fingerprint
                )
                if swap.previous
                else None,
                current=pb.IndexVersionRef(number=swap.current.number, fingerprint=swap.current.fingerprint),
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
    keep.check()
    return keep


def kept_events(kept: KeptEvents | None) -> pb.ReadStreamEventsResponse:
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
    shared = Counter(session.ref.fingerprint for session in sessions)
    response.versions.extend(
        pb.VersionStatus(fingerprint=v.fingerprint, tool_count=len(v.tools), sessions=shared[v.fingerprint])
        for v in versions
    )
    return response
