"""One access line per MCP request: what was asked, what answered it, how it ended, how long it took.

    mcp POST tools/call call_tool tool=alerts backend=weather outcome=ok status=200 ms=12.4
        index=v2/3f2a9c1e0b7d session=#5d41402abc4b subject=alice

A request the authorization policy denied ends with what decided, the action and the policies'
labels (`-`: no policy permits it), never the tool's name: `... subject=bob denied=call_tool:no-stats`.

Three parts fill in one `AccessRecord` per request, which a context variable hands down: the
`AccessLog` ASGI layer around `/mcp` (the JSON-RPC method, from the body as it passes, and the HTTP
status), an indexer client interceptor (the session, the principal's subject, the index version and,
for call_tool, the resolved tool and its backend, read off the indexer's answers), and a wrapper of
the `tools/call` handler (the meta-tool and its outcome). Nothing of the caller's credentials reaches
the record; the session id, a capability, appears only as a short hash. A JSON line carries the
same values as fields of its own (toolsearch/logs.py).

With traces on (toolsearch/tracing.py) the same two layers make the spans: the request's SERVER
span, a child of the client's `traceparent` when it sent one, carries the record's values as
attributes (never an argument or a token); each indexer call is a CLIENT span whose context goes to
the indexer in the call's gRPC metadata.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.observe.denials import denial_of
from router.observe.metrics import TOOLS, call_outcome
from toolsearch.tracing import inject_metadata, rpc_name

# named for what it is, not where it lives: operators filter their log on this name
logger = logging.getLogger("router.access_log")

# bodies above this are not parsed again for their method: the access line then says "?"
_MAX_SNIFFED = 1 << 20

# a tools/call handler: the SDK's (its context, the params) or the session layer's direct one (the
# caller, the params, the request's id: router/frontdoor/direct_calls.py)
Handler = Callable[..., Awaitable[Any]]
_tracer = trace.get_tracer("toolsearch.router")
# the only headers a trace context is read from: the rest (Authorization above all) stay out of it
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})


def session_hash(session_id: str) -> str:
    """A short, stable stand-in for a session id in logs: it names the session without granting it."""
    return "#" + hashlib.sha256(session_id.encode()).hexdigest()[:12] if session_id else "-"


@dataclass(slots=True)
class AccessRecord:
    """What is known of one request so far; the access line is written from it at the end."""

    http_method: str
    method: str = ""  # the JSON-RPC method
    tool: str = ""  # the meta-tool of a tools/call
    target: str = ""  # call_tool: the resolved tool's advertised name
    backend: str = ""  # call_tool: the backend that owns it
    outcome: str = ""  # a tools/call's ok | tool_error | error; else from the HTTP status
    status: int = 0
    version: str = ""  # the index version that answered: v<number>/<fingerprint prefix>
    session_id: str = ""
    subject: str = ""
    denied: str = ""  # the policies that denied it (router/observe/denials.py): never a tool's name

    def fields(self, took_ms: float) -> dict[str, Any]:
        outcome = self.outcome or _status_outcome(self.status)
        return {
            "http_method": self.http_method,
            "method": self.method or "-",
            "tool": self.tool or "-",
            "target": self.target or "-",
            "backend": self.backend or "-",
            "outcome": outcome,
            "status": self.status,
            "ms": round(took_ms, 1),
            "index": self.version or "-",
            "session": session_hash(self.session_id),
            "subject": self.subject or "-",
            "denied": self.denied or "-",
        }


def _status_outcome(status: int) -> str:
    if status < 400:
        return "ok"
    return "rejected" if status < 500 else "failed"


def _format(fields: dict[str, Any]) -> str:
    tool = f" {fields['tool']}" if fields["tool"] != "-" else ""
    return (
        f"mcp {fields['http_method']} {fields['method']}{tool} tool={fields['target']} "
        f"backend={fields['backend']} outcome={fields['outcome']} status={fields['status']} "
        f"ms={fields['ms']} index={fields['index']} session={fields['session']} subject={fields['subject']}"
        + (f" denied={fields['denied']}" if fields["denied"] != "-" else "")
    )


_current: ContextVar[AccessRecord | None] = ContextVar("toolsearch_access", default=None)


def _sniff(body: bytes) -> tuple[str, str]:
    """The JSON-RPC method of a posted body and, for tools/call, the tool name ("" when absent)."""
    if not body or len(body) > _MAX_SNIFFED:
        return ("?" if body else "", "")
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return "?", ""
    if not isinstance(message, dict) or not isinstance(message.get("method"), str):
        return "?", ""
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return message["method"], name if isinstance(name, str) else ""


class AccessLog:
    """ASGI: one access line, at INFO, for each request to `path` (the MCP endpoint).

    `listeners` get each line's fields too (the status page charts find_tool's latency from them).
    """

    def __init__(
        self, app: ASGIApp, path: str = "/mcp", listeners: Sequence[Callable[[dict[str, Any]], None]] = ()
    ) -> None:
        self.app = app
        self.path = path
        self.listeners = tuple(listeners)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != self.path:
            await self.app(scope, receive, send)
            return
        record = AccessRecord(http_method=str(scope.get("method", "")))
        token = _current.set(record)
        chunks: list[bytes] = []
        size = 0

        async def sniffing_receive() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request" and size <= _MAX_SNIFFED:
                chunk = message.get("body", b"")
                size += len(chunk)
                chunks.append(chunk)
            return message

        async def status_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = int(message["status"])
            await send(message)

        headers = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in scope.get("headers", ())
            if key.decode("latin-1").lower() in _TRACE_HEADERS
        }
        started = time.perf_counter()
        # named as HTTP server spans are; the SDK's own span for the JSON-RPC method is its child
        span_name = f"{record.http_method} {self.path}"
        with _tracer.start_as_current_span(
            span_name, context=propagate.extract(headers), kind=SpanKind.SERVER
        ) as span:
            try:
                await self.app(scope, sniffing_receive, status_send)
            finally:
                _current.reset(token)
                method, name = _sniff(b"".join(chunks)) if size <= _MAX_SNIFFED else ("?", "")
                record.method = method
                if method == "tools/call" and not record.tool:
                    record.tool = name if name in TOOLS else "other"
                record.status = record.status or 500
                fields = record.fields((time.perf_counter() - started) * 1000)
                logger.info("%s", _format(fields), extra={"fields": fields})
                for listener in self.listeners:
                    listener(fields)
                _describe(span, fields)

    @staticmethod
    def observe_tool_calls(handler: Handler) -> Handler:
        """Wrap a `tools/call` handler so the access line names the meta-tool and its outcome."""

        async def observed(ctx: Any, params: Any, *rest: Any) -> Any:
            record = _current.get()
            if record is None:
                return await handler(ctx, params, *rest)
            name = getattr(params, "name", "")
            record.tool = name if name in TOOLS else "other"
            record.outcome = "error"  # unless the handler returns
            result = await handler(ctx, params, *rest)
            record.outcome = call_outcome(result)
            return result

        return observed


def _describe(span: trace.Span, fields: dict[str, Any]) -> None:
    """A request span's attributes, from its access line's fields."""
    if not span.is_recording():
        return
    attributes = {
        "http.request.method": fields["http_method"],
        "http.response.status_code": fields["status"],
        "mcp.method.name": fields["method"],
        "toolsearch.tool": fields["tool"],
        "toolsearch.target": fields["target"],
        "toolsearch.backend": fields["backend"],
        "toolsearch.index_version": fields["index"],
        "toolsearch.outcome": fields["outcome"],
        "toolsearch.session": fields["session"],
        "toolsearch.authorization.denied": fields["denied"],
    }
    span.set_attributes({key: value for key, value in attributes.items() if value != "-"})
    if fields["outcome"] in ("error", "failed"):
        span.set_status(StatusCode.ERROR, fields["outcome"])


class AccessInterceptor(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Reads the request's session, principal, index version and resolved tool off indexer calls.

    Each call is also a CLIENT span, its context passed on in the call's metadata.
    """

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        details = client_call_details
        method = rpc_name(details.method)
        record = _current.get()
        with _tracer.start_as_current_span(f"indexer {method}", kind=SpanKind.CLIENT) as span:
            span.set_attributes(
                {"rpc.system": "grpc", "rpc.service": "toolsearch.v1.Indexer", "rpc.method": method}
            )
            pairs = [tuple(pair) for pair in (details.metadata or ())]
            details = details._replace(metadata=grpc.aio.Metadata(*inject_metadata(pairs)))
            call = await continuation(details, request)
            try:
                response = await call
            except grpc.aio.AioRpcError as exc:
                span.set_status(StatusCode.ERROR, exc.code().name)
                if record is not None:
                    note(record, request, None)  # who asked, and for which session, even when it failed
                    if (denied := denial_of(exc, request)) is not None:
                        record.denied = f"{denied.action}:{denied.label}"
                raise
        if record is not None:
            note(record, request, response)
        return call


def note(record: AccessRecord, request: Any, response: Any) -> None:
    """Copy what an indexer request and its answer (None when it failed) say into `record`."""
    principal = getattr(request, "principal", None)
    if principal is not None and principal.subject:
        record.subject = principal.subject
    session_id = getattr(response, "session_id", "") or getattr(request, "session_id", "")
    if session_id:
        record.session_id = session_id
    version = getattr(response, "version", None)
    if version is not None and version.fingerprint:
        record.version = f"v{version.number}/{version.fingerprint[:12]}"
    # a call_tool's tool comes resolved by ResolveTool, or with the session check (`tool`)
    resolved = getattr(response, "tool", None) or response
    backend = getattr(resolved, "backend_id", "")
    if backend:
        record.backend = backend
        record.target = getattr(resolved, "name", "") or getattr(request, "name", "")
