"""The indexer's records as the protobuf messages the router reads, and back: the wire format stays
out of the models, and the gRPC servicer (indexer/api/service.py) only calls these."""

from __future__ import annotations

from indexer.backends.registry import BackendState
from indexer.errors import ToolNotFound
from indexer.sessions.views import LiveSession
from indexer.state import BackendSession, Principal, SessionRecord
from toolsearch.backend_settings import Backend
from toolsearch.v1 import indexer_pb2 as pb


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


def version_ref(session: LiveSession) -> pb.IndexVersionRef:
    current = session.current
    return pb.IndexVersionRef(number=current.number, fingerprint=current.version.fingerprint)


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
