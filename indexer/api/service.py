"""The gRPC servicer of `toolsearch.v1.Indexer`: each method checks what the router sent, asks the
flow that answers it, and gives the answer its wire form; indexer errors become status codes on the
way out (`with_status_codes`, indexer/api/status_codes.py).

The indexer's values become protobuf messages through indexer/api/messages.py (a backend's
`BackendHealth` a `BackendStatus`, the finder's `Found` a `FindToolsResponse`, for instance): the
flows and models inside stay free of the wire format.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

import grpc

from indexer.api import messages
from indexer.api.finder import Finder
from indexer.api.messages import (
    backend_session,
    checked_arguments,
    checked_capabilities,
    checked_claims,
    offered_of,
    principal_of,
    resolve_tool_response,
    version_ref,
)
from indexer.api.pinned import pinned
from indexer.api.reachable import reachable_targets
from indexer.api.resolution import ToolResolver
from indexer.api.status_codes import with_status_codes
from indexer.backends.backend_tokens import BackendTokens
from indexer.backends.registry import Registry
from indexer.errors import InvalidRequest
from indexer.retrieval.embeddings import Embeddings
from indexer.sessions.backend_session_waits import stamp_of
from indexer.sessions.manager import SessionManager
from indexer.state.rounds import LocalRounds, RoundStore
from indexer.state.stream_events import LocalStreams, StreamStore
from toolsearch.kept_streams import MAX_EVENTS
from toolsearch.sections.indexer_settings import Naming
from toolsearch.sessions import KEPT_ID, LOG_LEVELS, BackendSession, Subscription
from toolsearch.targets import BackendTarget, KeptSessions
from toolsearch.v1 import indexer_pb2 as pb
from toolsearch.v1 import indexer_pb2_grpc as pb_grpc

_MAX_ROUND_BYTES = 1 << 20  # an input round's record: the backend's requests of the client, or the result
_MAX_ROUND_TTL = 3600.0  # seconds an input round may be kept: a call's timeout, and some
_MAX_SESSION_ID = 1024  # characters of a backend session id or protocol version the state keeps
_MAX_URI = 2048  # characters of a subscribed resource's URI
_MAX_ITEMS = 10_000  # items VisibleItems asks about at once


def _check_round(token: str, record: str, ttl: float) -> None:
    """Raise `InvalidRequest` for an input round the router would not make."""
    if not KEPT_ID.fullmatch(token):
        raise InvalidRequest("an input round's token is 16 to 64 url-safe characters")
    if len(record.encode()) > _MAX_ROUND_BYTES:
        raise InvalidRequest(f"an input round's record is at most {_MAX_ROUND_BYTES} bytes")
    if not 0 < ttl <= _MAX_ROUND_TTL:
        raise InvalidRequest(f"an input round is kept for more than 0 and at most {_MAX_ROUND_TTL:g} seconds")


class IndexerService(pb_grpc.IndexerServicer):
    """Answers the router: sessions, searches, resolutions and status."""

    def __init__(
        self,
        sessions: SessionManager,
        registry: Registry,
        finder: Finder,
        embeddings: Embeddings,
        naming: Naming | None = None,
        tokens: BackendTokens | None = None,
        tools_changed: Callable[[str], Awaitable[None]] | None = None,
        rounds: RoundStore | None = None,
        streams: StreamStore | None = None,
    ) -> None:
        self._sessions = sessions
        self._rounds = rounds or LocalRounds()  # calls waiting for their client's input
        self._streams = streams or LocalStreams()  # call streams kept for their clients to resume
        # has a backend whose tools changed listed again soon (Indexer.tools_changed)
        self._tools_changed = tools_changed
        self._tokens = tokens  # the tokens of token_exchange backends (ExchangeToken)
        self._registry = registry
        self._finder = finder
        self._embeddings = embeddings
        self._naming = naming or Naming()  # how tool names are made unique; resources and prompts follow it
        self._resolver = ToolResolver(registry, sessions.access)

    @with_status_codes
    async def OpenSession(
        self, request: pb.OpenSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.OpenSessionResponse:
        principal = principal_of(request.principal)
        session = await self._sessions.open(
            principal,
            request.credentials.bearer_token or None,
            implied=request.implied,
            session_id=request.session_id,
            capabilities=checked_capabilities(request.client_capabilities_json),
            claims=checked_claims(principal, request.claims_json),
        )
        tool = self._resolver.resolved(session, request.resolve) if request.resolve else None
        return pb.OpenSessionResponse(
            session_id=session.id,
            version=version_ref(session),
            backends=sorted(session.record.accepted),
            rejected_backends=sorted(session.record.rejected_at_creation),
            tool=resolve_tool_response(tool) if tool is not None else None,
        )

    @with_status_codes
    async def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSessionResponse:
        session = await self._sessions.get(request.session_id, principal_of(request.principal))
        tool = self._resolver.resolved(session, request.resolve) if request.resolve else None
        return pb.GetSessionResponse(
            session_id=session.id,
            version=version_ref(session),
            tool=resolve_tool_response(tool) if tool is not None else None,
            log_level=session.record.log_level,
            client_capabilities_json=session.record.client_capabilities,
        )

    @with_status_codes
    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CloseSessionResponse:
        token = request.credentials.bearer_token or None
        await self._sessions.close(request.session_id, principal_of(request.principal), token)
        return pb.CloseSessionResponse()

    @with_status_codes
    async def SetBackendSession(
        self, request: pb.SetBackendSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetBackendSessionResponse:
        if request.backend_id not in self._registry.states:
            raise InvalidRequest(f"unknown backend: {request.backend_id}")
        given = request.backend_session
        if len(given.session_id) > _MAX_SESSION_ID or len(given.protocol_version) > _MAX_SESSION_ID:
            raise InvalidRequest(f"a backend session id is at most {_MAX_SESSION_ID} characters")
        # a stateless backend's "session" is its negotiated version alone
        known = given.session_id or given.protocol_version
        wanted = BackendSession(given.session_id, given.protocol_version) if known else None
        stored = await self._sessions.set_backend_session(
            request.session_id, principal_of(request.principal), request.backend_id, request.previous, wanted
        )
        return pb.SetBackendSessionResponse(stored=backend_session(stored))

    @with_status_codes
    async def BackendSessions(
        self, request: pb.BackendSessionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.BackendSessionsResponse:
        session = await self._sessions.backend_sessions(
            request.session_id, principal_of(request.principal), request.seen, request.wait_ms / 1000
        )
        record = session.record
        subscriptions = frozenset(s for s in record.subscriptions if s.backend_id in self._registry.states)
        kept = KeptSessions(stamp_of(record), self._kept(record.backend_sessions), subscriptions)
        return messages.backend_sessions_response(kept)

    @with_status_codes
    async def SetLogLevel(
        self, request: pb.SetLogLevelRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetLogLevelResponse:
        if request.level not in LOG_LEVELS:
            raise InvalidRequest(
                f"unknown log level {request.level[:40]!r}: use one of {', '.join(LOG_LEVELS)}"
            )
        session = await self._sessions.set_log_level(
            request.session_id, principal_of(request.principal), request.level
        )
        kept = self._kept(session.record.backend_sessions)
        return pb.SetLogLevelResponse(backends=[messages.session_at_backend(target) for target in kept])

    @with_status_codes
    async def Subscribe(
        self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubscribeResponse:
        wanted = request.subscription
        if wanted.backend_id not in self._registry.states:
            raise InvalidRequest(f"unknown backend: {wanted.backend_id[:100]}")
        if not wanted.uri or len(wanted.uri) > _MAX_URI:
            raise InvalidRequest(f"a subscription names a URI of 1 to {_MAX_URI} characters")
        await self._sessions.subscribe(
            request.session_id,
            principal_of(request.principal),
            Subscription(wanted.backend_id, wanted.uri),
            request.subscribed,
        )
        return pb.SubscribeResponse()

    @with_status_codes
    async def ToolsChanged(
        self, request: pb.ToolsChangedRequest, context: grpc.aio.ServicerContext
    ) -> pb.ToolsChangedResponse:
        # only a live session's router may ask: the ask costs a probe of a backend
        await self._sessions.get(request.session_id, principal_of(request.principal))
        if request.backend_id not in self._registry.states:
            raise InvalidRequest(f"unknown backend: {request.backend_id[:100]}")
        if self._tools_changed is not None:
            await self._tools_changed(request.backend_id)
        return pb.ToolsChangedResponse()

    @with_status_codes
    async def KeepInputRound(
        self, request: pb.KeepInputRoundRequest, context: grpc.aio.ServicerContext
    ) -> pb.KeepInputRoundResponse:
        await self._sessions.get(request.session_id, principal_of(request.principal))
        _check_round(request.token, request.record_json, request.ttl_seconds)
        await self._rounds.put(request.session_id, request.token, request.record_json, request.ttl_seconds)
        return pb.KeepInputRoundResponse()

    @with_status_codes
    async def ReadInputRound(
        self, request: pb.ReadInputRoundRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadInputRoundResponse:
        await self._sessions.get(request.session_id, principal_of(request.principal))
        _check_round(request.token, "", 1.0)
        record = await self._rounds.get(request.session_id, request.token)
        return pb.ReadInputRoundResponse(found=record is not None, record_json=record or "")

    @with_status_codes
    async def KeepStreamEvents(
        self, request: pb.KeepStreamEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.KeepStreamEventsResponse:
        await self._sessions.get(request.session_id, principal_of(request.principal))
        await self._streams.keep(messages.events_to_keep(request))
        return pb.KeepStreamEventsResponse()

    @with_status_codes
    async def ReadStreamEvents(
        self, request: pb.ReadStreamEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadStreamEventsResponse:
        await self._sessions.get(request.session_id, principal_of(request.principal))
        limit = min(max(request.limit, 1), MAX_EVENTS)
        kept = await self._streams.read(request.session_id, request.stream_id, request.after, limit)
        return messages.read_stream_events_response(kept)

    def _kept(self, sessions: Mapping[str, BackendSession]) -> tuple[BackendTarget, ...]:
        """The backend sessions a router can reach, in backend id order: of configured backends,
        with a session id, each as its backend's target."""
        kept = []
        for backend_id, at_backend in sorted(sessions.items()):
            state = self._registry.states.get(backend_id)
            if state is None or not at_backend.session_id:
                continue  # gone from the configuration, or a stateless backend's
            kept.append(state.target(at_backend))
        return tuple(kept)

    @with_status_codes
    async def ReachableBackends(
        self, request: pb.ReachableBackendsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReachableBackendsResponse:
        session = await self._sessions.get(request.session_id, principal_of(request.principal))
        found = reachable_targets(session, self._registry, self._naming)
        authorized = self._sessions.access.authorizer is not None
        return messages.reachable_backends_response(replace(found, authorized=authorized))

    @with_status_codes
    async def ExchangeToken(
        self, request: pb.ExchangeTokenRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExchangeTokenResponse:
        state = self._registry.states.get(request.backend_id)
        if state is None or state.config.auth.type != "token_exchange" or self._tokens is None:
            raise InvalidRequest(f"backend {request.backend_id} does not exchange tokens")
        token = await self._tokens.token_for(
            state.config,
            principal_of(request.principal),
            request.credentials.bearer_token or None,
            renew=request.renew,
        )
        return pb.ExchangeTokenResponse(access_token=token)

    @with_status_codes
    async def FindTools(
        self, request: pb.FindToolsRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindToolsResponse:
        session = await self._sessions.get(request.session_id, principal_of(request.principal))
        found = await self._finder.find(
            session, request.query, list(request.keywords), request.limit, request.compact
        )
        return messages.find_tools_response(found)

    @with_status_codes
    async def ResolveTool(
        self, request: pb.ResolveToolRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResolveToolResponse:
        session = await self._sessions.get(request.session_id, principal_of(request.principal))
        return resolve_tool_response(self._resolver.resolve(session, request.name))

    @with_status_codes
    async def PinnedTools(
        self, request: pb.PinnedToolsRequest, context: grpc.aio.ServicerContext
    ) -> pb.PinnedToolsResponse:
        session = await self._sessions.get(request.session_id, principal_of(request.principal))
        tools = pinned(session, self._registry, request.patterns, self._naming)
        access = self._sessions.access
        if access.authorizer is not None:  # only what the caller may use
            shown = await asyncio.to_thread(access.visible_tools, session.record, tools)
            tools = [tool for tool, visible in zip(tools, shown, strict=True) if visible]
        return messages.pinned_tools(tools)

    @with_status_codes
    async def AuthorizeCall(
        self, request: pb.AuthorizeCallRequest, context: grpc.aio.ServicerContext
    ) -> pb.AuthorizeCallResponse:
        session = await self._sessions.get(request.session_id, principal_of(request.principal))
        item = offered_of(request.item)
        arguments = checked_arguments(request.arguments_json)
        if self._sessions.access.authorizer is None and item.kind != "tool":
            return pb.AuthorizeCallResponse()  # no policy: nothing to decide (a tool still resolves)
        policies = await asyncio.to_thread(self._resolver.authorize, session, item, arguments)
        return pb.AuthorizeCallResponse(policies=policies)

    @with_status_codes
    async def VisibleItems(
        self, request: pb.VisibleItemsRequest, context: grpc.aio.ServicerContext
    ) -> pb.VisibleItemsResponse:
        session = await self._sessions.get(request.session_id, principal_of(request.principal))
        if len(request.items) > _MAX_ITEMS:
            raise InvalidRequest(f"at most {_MAX_ITEMS} items are asked about at once")
        items = [offered_of(item) for item in request.items]
        visible = await asyncio.to_thread(self._sessions.access.visible, session.record, items)
        return pb.VisibleItemsResponse(visible=visible)

    @with_status_codes
    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusResponse:
        states, versions = self._registry.states.values(), self._finder.versions()
        return messages.status(self._embeddings, states, await self._sessions.records(), versions)
