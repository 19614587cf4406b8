"""The `Mcp-Session-Id` layer: an ASGI app in front of the SDK's stateless Streamable HTTP handler.

The SDK's stateful session manager keeps each session's transport in process memory, which would
pin a session to one router replica. The router runs the SDK stateless and keeps sessions in the
indexer instead; this layer issues the session id on the `initialize` response, checks it on every
other handshake-era request, ends it on `DELETE`, and hands the session to the tool handlers through
`scope["state"]`. Clients of the stateless 2026-07-28 protocol send no session header: their session
is implied by their principal.

Router errors become HTTP responses through `http_answer` (router/error_answers.py); the body is
always a JSON-RPC error.
Every answer the layer gives itself (an error, a DELETE's 200) is sent after the request's body is
drained (router/frontdoor/bodies.py), so a client still sending a body reads the answer instead of a reset.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import anyio
from mcp_types import INVALID_REQUEST
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.caller import NOTHING_DECLARED, STATE_KEY, Authenticator, Caller, Declared, Identity
from router.error_answers import http_answer, jsonrpc_error_response
from router.errors import RouterError, Unauthenticated
from router.exchange import Exchange
from router.frontdoor.bodies import DRAIN_FACTOR, Body, BodyTooLarge, ClientGone, answer_early
from router.frontdoor.declarations import request_declared, session_declared
from router.frontdoor.direct_calls import DirectCalls
from router.frontdoor.messages import (
    ClientError,
    JsonRpcMessage,
    is_handshake_era,
    parse_message,
)
from router.frontdoor.resource_metadata import ResourceMetadata
from router.frontdoor.streams.call_streams import CallStream
from router.frontdoor.streams.resumed_streams import ResumedStreams
from router.frontdoor.streams.standalone import StandaloneStreams
from router.frontdoor.streams.stream_cursor import is_cursor
from router.frontdoor.streams.stream_log import StreamLog
from router.handlers.meta_tool_schemas import CALL_TOOL, FIND_TOOL
from router.link.indexer_client import IndexerClient
from router.upstream.session_wide.backend_notices import BackendNotices
from toolsearch.logs import bind_session
from toolsearch.outgoing import SESSION_HEADER, VERSION_HEADER
from toolsearch.targets import ResolvedTool

logger = logging.getLogger(__name__)

JSONRPC_ID_KEY = "toolsearch.jsonrpc_id"  # and the posted message's id, for answers given outside it
LAST_EVENT_ID = "last-event-id"
MISSING_SESSION = "missing Mcp-Session-Id header: send the id returned by initialize"
# a handshake client's notifications its backend sessions are told of (`BackendNotices`)
PASSED_ON = frozenset({"notifications/cancelled", "notifications/roots/list_changed"})
# requests besides calls a backend may ask its client something during (a handshake-era client
# answers on the request's stream)
ASKED_DURING = frozenset({"resources/read", "prompts/get"})
# 2026-07-28 requests that reach backends, and so need the session the caller's principal implies
SESSION_METHODS = frozenset(
    {
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "subscriptions/listen",
    }
)


@dataclass(frozen=True, slots=True)
class Handoffs:
    """Where the session layer hands a request instead of the SDK's JSON handler, each optional.

    A `tools/call` that asks for progress goes to `streaming` (the SDK's handler answering with an
    SSE stream), so what its backend reports during the call reaches the client before the result.
    A call of a client that declared capabilities a backend may ask for (sampling, elicitation,
    roots) is streamed too, through a `CallStream` the relay writes such requests on. A handshake
    session's `notifications/cancelled` and `notifications/roots/list_changed` go to `notices`
    (which passes them on to the backends) before the SDK acknowledges them: the call a
    cancellation names may run on another replica; so does a client's answer to a backend's
    request, a posted response, which `notices` passes on to the backend that asked, saying
    whether it was one of those (else the SDK takes it, as any response). With `standalone`, a
    handshake session's `GET` opens its standalone stream there; a handshake session's streamed
    call is also kept in the indexer as it is written (router/frontdoor/streams/stream_log.py), and
    a `GET` with `Last-Event-ID` resumes it (router/frontdoor/streams/resumed_streams.py). With
    `direct`, a handshake session's find_tool and call_tool calls answered with JSON are answered
    there, in front of the SDK's server; a find's session is checked by the search itself
    (router/frontdoor/direct_calls.py).
    """

    streaming: ASGIApp | None = None
    notices: BackendNotices | None = None
    standalone: StandaloneStreams | None = None
    direct: DirectCalls | None = None


class SessionLayer:
    """Issues, checks and ends `Mcp-Session-Id` around the SDK's stateless handler `app`, and makes
    each request's `Exchange` (router/exchange.py) for what answers it.

    With `resource_metadata`, every 401 points at the RFC 9728 document
    (router/frontdoor/resource_metadata.py). `handoffs` says where else requests go.
    """

    def __init__(
        self,
        app: ASGIApp,
        indexer: IndexerClient,
        authenticator: Authenticator,
        max_body_bytes: int,
        resource_metadata: ResourceMetadata | None = None,
        handoffs: Handoffs = Handoffs(),
    ) -> None:
        standalone = handoffs.standalone
        self.app = app
        self.resumed = ResumedStreams(indexer, standalone.stopping) if standalone is not None else None
        self.direct = handoffs.direct
        self.standalone = standalone
        self.streaming_app = handoffs.streaming
        self.notices = handoffs.notices
        self.indexer = indexer
        self.authenticator = authenticator
        self.max_body_bytes = max_body_bytes
        self.resource_metadata = resource_metadata

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id: Any = None
        headers = Headers(scope=scope)
        body = Body(receive, headers, self.max_body_bytes, DRAIN_FACTOR * self.max_body_bytes)
        try:
            identity = await self.authenticator.authenticate(headers)
            method = scope["method"]
            if method == "POST":
                content_type = headers.get("content-type", "").partition(";")[0].strip().lower()
                if content_type != "application/json":
                    raise ClientError(
                        415, INVALID_REQUEST, "Unsupported Media Type: send Content-Type: application/json"
                    )
                content = await body.read()
                message = parse_message(content)
                request_id = message.id
                scope.setdefault("state", {})[JSONRPC_ID_KEY] = request_id
                receive = body.replay(content)
                await self._post(scope, receive, send, headers=headers, identity=identity, message=message)
                return
            if method == "DELETE":
                response = await self._delete(headers, identity)
            elif method == "GET" and self.standalone is not None and is_handshake_era(headers):
                caller = await self._listener(headers, identity)
                event_id = headers.get(LAST_EVENT_ID)
                if event_id is not None and is_cursor(event_id):  # a standalone stream's place
                    await self.standalone.serve(scope, receive, send, caller, event_id)
                elif event_id is not None and self.resumed is not None:
                    await self.resumed.serve(scope, receive, send, caller, event_id)
                else:
                    await self.standalone.serve(scope, receive, send, caller)
                return
            else:
                # 2026-07-28 has no standalone stream to open with GET: its client listens with a
                # `subscriptions/listen` request (router/handlers/listens.py)
                response = Response(status_code=405, headers={"Allow": "POST, DELETE"})
        except BodyTooLarge as exc:
            response = jsonrpc_error_response(413, INVALID_REQUEST, str(exc), request_id)
        except ClientError as exc:
            response = jsonrpc_error_response(exc.status, exc.code, exc.message, request_id)
        except Unauthenticated as exc:
            response = http_answer(exc, request_id)
            if self.resource_metadata is not None:
                challenge = self.resource_metadata.challenge(exc.www_authenticate, scope)
                response.headers["www-authenticate"] = challenge
        except RouterError as exc:
            response = http_answer(exc, request_id)
        except ClientGone:
            return
        await answer_early(response, body, scope, send)

    async def _post(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        headers: Headers,
        identity: Identity,
        message: JsonRpcMessage,
    ) -> None:
        session_id = ""
        resolved: ResolvedTool | None = None
        shared = False
        declared = NOTHING_DECLARED
        if is_handshake_era(headers):
            if message.method == "initialize" and message.is_request:
                await self._initialize(scope, receive, send, identity, message.declared_capabilities)
                return
            session_id = headers.get(SESSION_HEADER, "")
            if not session_id:
                raise ClientError(400, INVALID_REQUEST, MISSING_SESSION)
            direct = self.direct
            if direct is not None and (find := direct.params(scope, message, FIND_TOOL)) is not None:
                bind_session(session_id)
                exchange = Exchange(Caller(identity, session_id), message.id)
                await direct.answer(scope, receive, send, exchange, find, message)
                return
            checked = await self.indexer.get_session(session_id, identity.principal, message.named_tool)
            resolved = checked.tool
            declared = session_declared(checked.log_level, checked.capabilities_json)
            if await self._passed_on(Caller(identity, session_id), message):
                await Response(status_code=202)(scope, receive, send)
                return
        elif message.method in SESSION_METHODS and headers.get(VERSION_HEADER) in MODERN_PROTOCOL_VERSIONS:
            opened = await self.indexer.open_session(
                identity.principal,
                identity.bearer_token,
                implied=True,
                resolve=message.named_tool,
                claims=identity.claims,
            )
            session_id = opened.session_id
            resolved = opened.tool
            # every caller of an unverified principal shares its implied session (docs/auth.md)
            shared = not identity.principal.issuer
            declared = request_declared(message.meta)
        bind_session(session_id)  # the logs of the rest of this request name the session (a prefix)
        streaming = self.streaming_app
        if streaming is None or not _streamed_answer(
            message, declared, bool(session_id) and is_handshake_era(headers)
        ):
            exchange = Exchange(Caller(identity, session_id, resolved, shared, declared), message.id)
            direct = self.direct if session_id and is_handshake_era(headers) else None
            if direct is not None and (call := direct.params(scope, message, CALL_TOOL)) is not None:
                await direct.answer(scope, receive, send, exchange, call, message)
                return
            scope.setdefault("state", {})[STATE_KEY] = exchange
            await self.app(scope, receive, send)
            return
        log = None
        resumed = self.resumed
        if resumed is not None and session_id and is_handshake_era(headers):
            log = StreamLog(
                self.indexer, Caller(identity, session_id), json.dumps(message.id), resumed.detached
            )
        stream = CallStream(send, receive, log)
        caller = Caller(identity, session_id, resolved, shared, declared)
        scope.setdefault("state", {})[STATE_KEY] = Exchange(caller, message.id, stream)
        await _streamed(streaming, scope, receive, stream, log)

    async def _passed_on(self, caller: Caller, message: JsonRpcMessage) -> bool:
        """Pass a handshake client's notification its backends are told of on to them, and its
        answer to a backend's request to that backend; whether it was such an answer."""
        notices = self.notices
        if notices is None:
            return False
        if message.method in PASSED_ON and not message.is_request and message.method is not None:
            params = message.params if isinstance(message.params, dict) else {}
            await notices.noticed(caller, message.method, params)
        return message.answer is not None and await notices.answered(caller, message.answer)

    async def _initialize(
        self, scope: Scope, receive: Receive, send: Send, identity: Identity, capabilities_json: str
    ) -> None:
        # The SDK answers first, held back, so a refused initialize opens no session at all.
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        scope.setdefault("state", {})[STATE_KEY] = Exchange(Caller(identity, ""))
        await self.app(scope, receive, hold)
        start = held[0] if held and held[0]["type"] == "http.response.start" else None
        if start is not None and start["status"] == 200 and not _is_jsonrpc_error(held[1:]):
            opened = await self.indexer.open_session(
                identity.principal,
                identity.bearer_token,
                capabilities_json=capabilities_json,
                claims=identity.claims,
            )
            bind_session(opened.session_id)
            session_header = (SESSION_HEADER.lower().encode(), opened.session_id.encode())
            held[0] = {**start, "headers": [*start.get("headers", []), session_header]}
        for message in held:
            await send(message)

    async def _listener(self, headers: Headers, identity: Identity) -> Caller:
        """The caller of a GET that opens a session's standalone stream; raises `ClientError`s and
        `SessionNotFound`."""
        if "text/event-stream" not in headers.get("accept", ""):
            raise ClientError(406, INVALID_REQUEST, "Not Acceptable: a GET must accept text/event-stream")
        session_id = headers.get(SESSION_HEADER, "")
        if not session_id:
            raise ClientError(400, INVALID_REQUEST, MISSING_SESSION)
        checked = await self.indexer.get_session(session_id, identity.principal, "")
        bind_session(session_id)
        declared = session_declared(checked.log_level, checked.capabilities_json)
        return Caller(identity, session_id, declared=declared)

    async def _delete(self, headers: Headers, identity: Identity) -> Response:
        if not is_handshake_era(headers):
            # 2026-07-28 has no sessions to end.
            return Response(status_code=405, headers={"Allow": "POST"})
        session_id = headers.get(SESSION_HEADER, "")
        if not session_id:
            raise ClientError(400, INVALID_REQUEST, MISSING_SESSION)
        bind_session(session_id)
        await self.indexer.close_session(session_id, identity.principal, identity.bearer_token)
        return Response(status_code=200)


def _streamed_answer(message: JsonRpcMessage, declared: Declared, in_session: bool) -> bool:
    """Whether a request is answered with a stream: when something may come before its result.

    That is progress, log messages the client asked for (a handshake session's level, a 2026-07-28
    request's), or a backend's request of a client that can answer it on the stream, during a call
    (find_tool asks no backend) or, in a handshake session, a resource read or a prompt.
    """
    if message.method == "tools/call":
        answers = bool(declared.answers_on_stream) and message.called != FIND_TOOL
    elif message.method in ASKED_DURING and in_session:
        answers = bool(declared.answers_on_stream)
    else:
        return False
    return message.wants_progress or bool(declared.log_level) or answers


async def _streamed(
    app: ASGIApp, scope: Scope, receive: Receive, stream: CallStream, log: StreamLog | None
) -> None:
    """Run a streamed call through `app`, its events kept in `log` if there is one."""
    if log is None:
        await app(scope, receive, stream.asgi_send)
        return
    # the call outlives its client's connection; its events are kept until its answer
    async with anyio.create_task_group() as keeping:
        keeping.start_soon(log.run)
        async with anyio.create_task_group() as watching:
            watching.start_soon(stream.watch)
            await app(scope, stream.asgi_receive, stream.asgi_send)
            watching.cancel_scope.cancel()
        log.close()  # (the end of the SDK's answer closed it already: closing twice is nothing)


def _is_jsonrpc_error(body_messages: list[Message]) -> bool:
    body = b"".join(m.get("body", b"") for m in body_messages if m["type"] == "http.response.body")
    try:
        decoded = json.loads(body)
    except ValueError:
        return True  # not the JSON answer of a successful initialize
    return not isinstance(decoded, dict) or "error" in decoded
