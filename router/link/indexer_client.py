"""The calls the router makes to the indexer, each a request built from the router's values and an
answer turned back into them (router/link/indexer_answers.py, backend_targets.py), over the channels
of router/link/channels.py, which fail over between indexer addresses.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from router.link.backend_targets import (
    SessionAnswer,
    kept_sessions,
    reachable_targets,
    resolved_tool,
    session_answer,
    session_targets,
    stored_session,
)
from router.link.channels import IndexerChannels
from router.link.indexer_answers import STREAM_ENDS, found, kept_events, pinned_definitions, status_view
from toolsearch.found import Found
from toolsearch.kept_streams import EventsToKeep, KeptEvents
from toolsearch.sessions import BackendSession, Claims, Offered, Principal, Subscription
from toolsearch.targets import BackendTarget, KeptSessions, ReachableTargets, ResolvedTool
from toolsearch.transport import ChannelSecurity
from toolsearch.v1 import indexer_pb2 as pb


def _principal(principal: Principal) -> pb.Principal:
    return pb.Principal(issuer=principal.issuer, subject=principal.subject)


class IndexerClient:
    """The calls the router makes to the indexer, over one channel per indexer address.

    Create it inside the event loop that uses it (the application's lifespan) and `close` it there.
    `interceptors` see every call on every channel (the router's metrics use one); `security` is
    the link's protection (TLS credentials, the shared secret every call carries). OpenSession gets
    `open_session_timeout` (it may list backends and build an index version), other calls `timeout`.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        timeout: float,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        security: ChannelSecurity | None = None,
        open_session_timeout: float | None = None,
    ) -> None:
        self.channels = IndexerChannels(addresses, timeout, interceptors, security)
        self.addresses = self.channels.addresses
        self.timeout = timeout
        self.open_session_timeout = open_session_timeout or timeout

    async def close(self) -> None:
        """Close every channel; calls in flight are cancelled."""
        await self.channels.close()

    async def open_session(
        self,
        principal: Principal,
        bearer_token: str | None,
        *,
        implied: bool = False,
        resolve: str = "",
        capabilities_json: str = "",
        claims: Claims | None = None,
    ) -> SessionAnswer:
        """Open a session for `principal`; with `implied`, its implied session (created on first use).

        With `resolve`, the answer carries that tool's resolution too, when the name resolves;
        `capabilities_json` is what the client declared at initialize, kept with the session;
        `claims` those of the caller's verified token, which the authorization policy reads.
        """
        request = pb.OpenSessionRequest(
            claims_json=json.dumps(claims, separators=(",", ":"), default=str) if claims else "",
            principal=_principal(principal),
            credentials=pb.Credentials(bearer_token=bearer_token or ""),
            implied=implied,
            resolve=resolve,
            # the id every attempt proposes: one that may have run has opened this very session,
            # which a second attempt then answers, so the open is harmless twice
            session_id="" if implied else secrets.token_urlsafe(24),
            client_capabilities_json=capabilities_json,
        )
        opened: pb.OpenSessionResponse = await self.channels.call(
            lambda stub: stub.OpenSession, request, timeout=self.open_session_timeout
        )
        return session_answer(opened)

    async def get_session(self, session_id: str, principal: Principal, resolve: str = "") -> SessionAnswer:
        """Check that a session exists and belongs to `principal`; raises `SessionNotFound`.

        With `resolve`, the answer carries that tool's resolution too, when the name resolves.
        """
        principal_message = _principal(principal)
        request = pb.GetSessionRequest(session_id=session_id, principal=principal_message, resolve=resolve)
        checked: pb.GetSessionResponse = await self.channels.call(lambda stub: stub.GetSession, request)
        return session_answer(checked)

    async def close_session(
        self, session_id: str, principal: Principal, bearer_token: str | None = None
    ) -> None:
        """End a session (its backend sessions too, at passthrough ones with `bearer_token`).

        Raises `SessionNotFound` when it is unknown or foreign.
        """
        request = pb.CloseSessionRequest(
            session_id=session_id,
            principal=_principal(principal),
            credentials=pb.Credentials(bearer_token=bearer_token or ""),
        )
        await self.channels.call(lambda stub: stub.CloseSession, request, if_gone=pb.CloseSessionResponse())

    async def set_backend_session(
        self,
        session_id: str,
        principal: Principal,
        backend_id: str,
        previous: str,
        backend_session: BackendSession,
    ) -> BackendSession:
        """Keep a backend session with the client session, unless another replica's came first.

        Returns the one the session keeps now: `backend_session`, or the one that won.
        """
        request = pb.SetBackendSessionRequest(
            session_id=session_id,
            principal=_principal(principal),
            backend_id=backend_id,
            previous=previous,
            backend_session=stored_session(backend_session),
        )
        response: pb.SetBackendSessionResponse = await self.channels.call(
            lambda stub: stub.SetBackendSession, request
        )
        return BackendSession(response.stored.session_id, response.stored.protocol_version)

    async def backend_sessions(self, session_id: str, principal: Principal) -> list[BackendTarget]:
        """The backends the session has a backend session at, each with it; raises `SessionNotFound`."""
        request = pb.BackendSessionsRequest(session_id=session_id, principal=_principal(principal))
        response: pb.BackendSessionsResponse = await self.channels.call(
            lambda stub: stub.BackendSessions, request
        )
        return session_targets(response)

    async def kept_sessions(
        self, session_id: str, principal: Principal, seen: str = "", wait: float = 0.0
    ) -> KeptSessions:
        """The session's backend sessions; when `seen` is their stamp, once they change (through any
        replica) or after `wait` seconds. Raises `SessionNotFound`."""
        request = pb.BackendSessionsRequest(
            session_id=session_id, principal=_principal(principal), seen=seen, wait_ms=int(wait * 1000)
        )
        response: pb.BackendSessionsResponse = await self.channels.call(
            lambda stub: stub.BackendSessions, request, timeout=wait + self.timeout
        )
        return kept_sessions(response)

    async def set_log_level(self, session_id: str, principal: Principal, level: str) -> list[BackendTarget]:
        """Keep the log level the session's client set; the backend sessions to pass it on to.

        Raises `SessionNotFound`, or `InvalidRequest` for a level that is not MCP's.
        """
        request = pb.SetLogLevelRequest(session_id=session_id, principal=_principal(principal), level=level)
        response: pb.SetLogLevelResponse = await self.channels.call(lambda stub: stub.SetLogLevel, request)
        return session_targets(response)

    async def subscribe(
        self, session_id: str, principal: Principal, subscription: Subscription, subscribed: bool
    ) -> None:
        """Keep (or drop) a subscription the session's standalone stream asks its backend for.

        Raises `SessionNotFound`, or `InvalidRequest` beyond the session's bound.
        """
        request = pb.SubscribeRequest(
            session_id=session_id,
            principal=_principal(principal),
            subscription=pb.Subscription(backend_id=subscription.backend_id, uri=subscription.uri),
            subscribed=subscribed,
        )
        await self.channels.call(lambda stub: stub.Subscribe, request)

    async def tools_changed(self, session_id: str, principal: Principal, backend_id: str) -> None:
        """Tell the indexer a backend of the session said its tools changed: it lists them again soon."""
        request = pb.ToolsChangedRequest(
            session_id=session_id, principal=_principal(principal), backend_id=backend_id
        )
        await self.channels.call(lambda stub: stub.ToolsChanged, request)

    async def keep_input_round(
        self, session_id: str, principal: Principal, token: str, record: Mapping[str, Any], ttl: float
    ) -> None:
        """Keep a call's input round with the session under `token` for `ttl` seconds (docs/gateway.md);
        raises `SessionNotFound`."""
        request = pb.KeepInputRoundRequest(
            session_id=session_id,
            principal=_principal(principal),
            token=token,
            record_json=json.dumps(record, separators=(",", ":")),
            ttl_seconds=ttl,
        )
        await self.channels.call(lambda stub: stub.KeepInputRound, request)

    async def read_input_round(
        self, session_id: str, principal: Principal, token: str
    ) -> dict[str, Any] | None:
        """The input round kept with the session under `token`, or None (expired, or not this
        session's); raises `SessionNotFound`."""
        request = pb.ReadInputRoundRequest(
            session_id=session_id, principal=_principal(principal), token=token
        )
        response: pb.ReadInputRoundResponse = await self.channels.call(
            lambda stub: stub.ReadInputRound, request
        )
        if not response.found:
            return None
        record = json.loads(response.record_json)
        return record if isinstance(record, dict) else None

    async def keep_stream_events(self, principal: Principal, keep: EventsToKeep) -> None:
        """Keep a call's stream events, numbered from `keep.first_seq`, with the session for
        `keep.ttl` seconds past this keep (docs/gateway.md, "Streams a client resumes"); raises
        `SessionNotFound`."""
        request = pb.KeepStreamEventsRequest(
            session_id=keep.session_id,
            principal=_principal(principal),
            stream_id=keep.stream_id,
            first_seq=keep.first_seq,
            events=keep.events,
            end=STREAM_ENDS[keep.end],
            ttl_seconds=keep.ttl,
            request_id_json=keep.request_id,
        )
        await self.channels.call(lambda stub: stub.KeepStreamEvents, request)

    async def read_stream_events(
        self, session_id: str, principal: Principal, stream_id: str, after: int, limit: int
    ) -> KeptEvents | None:
        """The kept events of the session's stream after number `after`, at most `limit`; None when
        none is kept (it expired, or is not this session's); raises `SessionNotFound`."""
        request = pb.ReadStreamEventsRequest(
            session_id=session_id,
            principal=_principal(principal),
            stream_id=stream_id,
            after=after,
            limit=limit,
        )
        return kept_events(await self.channels.call(lambda stub: stub.ReadStreamEvents, request))

    async def reachable_backends(self, session_id: str, principal: Principal) -> ReachableTargets:
        """The session's advertised backends that offer resources, prompts or completions."""
        request = pb.ReachableBackendsRequest(session_id=session_id, principal=_principal(principal))
        response: pb.ReachableBackendsResponse = await self.channels.call(
            lambda stub: stub.ReachableBackends, request
        )
        return reachable_targets(response)

    async def find_tools(
        self,
        session_id: str,
        principal: Principal,
        query: str,
        keywords: Sequence[str],
        limit: int,
        compact: bool = False,
    ) -> Found:
        """Search the session's current index version; `limit` 0 means the indexer's default."""
        request = pb.FindToolsRequest(
            session_id=session_id,
            principal=_principal(principal),
            query=query,
            keywords=keywords,
            limit=limit,
            compact=compact,
        )
        return found(await self.channels.call(lambda stub: stub.FindTools, request))

    async def pinned_tools(self, session_id: str, principal: Principal, patterns: Sequence[str]) -> list[str]:
        """The MCP definitions (JSON) of the session's tools that match the operator's pinned patterns."""
        request = pb.PinnedToolsRequest(
            session_id=session_id, principal=_principal(principal), patterns=patterns
        )
        return pinned_definitions(await self.channels.call(lambda stub: stub.PinnedTools, request))

    async def authorize_call(
        self, session_id: str, principal: Principal, item: Offered, arguments: Mapping[str, Any]
    ) -> None:
        """Ask the indexer whether the caller may make this call with these arguments: returns when it
        may; raises `ToolNotFound` for a denied tool (as for an unknown one), `ItemNotFound` for a
        denied prompt or resource, each with the policies that decided in `denied_by`."""
        request = pb.AuthorizeCallRequest(
            session_id=session_id,
            principal=_principal(principal),
            item=pb.Offered(kind=item.kind, name=item.name, backend_id=item.backend_id),
            arguments_json=json.dumps(arguments, separators=(",", ":"), default=str),
        )
        await self.channels.call(lambda stub: stub.AuthorizeCall, request, asked=item.name)

    async def visible_items(
        self, session_id: str, principal: Principal, items: Sequence[Offered]
    ) -> list[bool]:
        """Which of the items the session's caller may see, in order."""
        request = pb.VisibleItemsRequest(
            session_id=session_id,
            principal=_principal(principal),
            items=[pb.Offered(kind=i.kind, name=i.name, backend_id=i.backend_id) for i in items],
        )
        answer: pb.VisibleItemsResponse = await self.channels.call(lambda stub: stub.VisibleItems, request)
        return list(answer.visible)

    async def resolve_tool(self, session_id: str, principal: Principal, name: str) -> ResolvedTool:
        """Resolve an advertised tool name to its backend; raises `ToolNotFound`."""
        request = pb.ResolveToolRequest(session_id=session_id, principal=_principal(principal), name=name)
        response: pb.ResolveToolResponse = await self.channels.call(
            lambda stub: stub.ResolveTool, request, asked=name
        )
        return resolved_tool(response)

    async def exchange_token(
        self, principal: Principal, bearer_token: str, backend_id: str, renew: bool = False
    ) -> str:
        """A token for a token_exchange backend, in exchange for the caller's; never logged.

        The indexer exchanges it at the backend's token endpoint, or hands back the one it keeps for
        the principal. Raises `ExchangeFailed` or `ExchangeRefused`, whose reason the indexer wrote.
        It may call out to the endpoint, as opening a session may list backends: it has that time.
        """
        request = pb.ExchangeTokenRequest(
            principal=_principal(principal),
            credentials=pb.Credentials(bearer_token=bearer_token),
            backend_id=backend_id,
            renew=renew,
        )
        response: pb.ExchangeTokenResponse = await self.channels.call(
            lambda stub: stub.ExchangeToken,
            request,
            asked=backend_id,
            timeout=self.open_session_timeout,
        )
        return response.access_token

    async def status(self) -> dict[str, Any]:
        """The indexer's backends, index versions, recent swaps and embedding counters, as plain data."""
        return status_view(await self.channels.call(lambda stub: stub.Status, pb.StatusRequest()))

    async def check_health(self) -> dict[str, str]:
        """Each address's answer to the standard gRPC health check: SERVING, NOT_SERVING, or why not."""
        return await self.channels.check_health()
