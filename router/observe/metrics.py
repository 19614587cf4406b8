"""The router's Prometheus metrics, served at `/metrics`: tool calls, HTTP requests, indexer calls.

Every label is bounded: the meta-tool (`find_tool`, `call_tool`, or `other` for a name the router
does not serve) and the call's outcome; the route, method and status of an HTTP request; the indexer
method and its gRPC status code; a denial's action and the label of the policy that decided (the
operator's policy file bounds them). Never a session id, and never a backend tool's name: a catalog can
hold thousands of them. Each app has its own registry, so several apps in one process do not clash.

`RequestObserver` is the outermost ASGI layer: it also gives each request its id for the logs
(`X-Request-Id`, a safe one the client sent or a new one, echoed on the response), which the
indexer interceptor passes on to the indexer in gRPC metadata.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.observe.denials import denial_of
from toolsearch.logs import REQUEST_ID_HEADER, bound, clean_request_id, current_request_id
from toolsearch.tracing import rpc_name

TOOLS = frozenset({"find_tool", "call_tool"})
ROUTES = frozenset({"/mcp", "/healthz", "/readyz", "/metrics", "/status", "/status.json"})
HTTP_METHODS = frozenset({"GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"})
# Tool calls span a fast search and a backend call that may take its whole timeout.
_TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_INDEXER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# a tools/call handler: the SDK's (its context, the params) or the session layer's direct one (the
# caller, the params, the request's id: router/frontdoor/direct_calls.py)
Handler = Callable[..., Awaitable[Any]]


def call_outcome(result: Any) -> str:
    """`tool_error` for a tool result with isError (the model can correct it), else `ok`."""
    if isinstance(result, Mapping):
        return "tool_error" if result.get("isError") else "ok"
    return "tool_error" if getattr(result, "is_error", False) else "ok"


class RouterMetrics:
    """The router's metric families in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tool_calls = Counter(
            "toolsearch_router_tool_calls",
            "Meta-tool calls by tool and outcome (ok; tool_error: an isError result; error: JSON-RPC)",
            ["tool", "outcome"],
            registry=self.registry,
        )
        self.tool_seconds = Histogram(
            "toolsearch_router_tool_call_duration_seconds",
            "Meta-tool call latency by tool and outcome",
            ["tool", "outcome"],
            buckets=_TOOL_BUCKETS,
            registry=self.registry,
        )
        self.http_requests = Counter(
            "toolsearch_router_http_requests",
            "HTTP requests by route, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.http_seconds = Histogram(
            "toolsearch_router_http_request_duration_seconds",
            "HTTP request latency by route",
            ["route"],
            buckets=_TOOL_BUCKETS,
            registry=self.registry,
        )
        self.denials = Counter(
            "toolsearch_router_authorization_denials",
            "Tool calls, prompt gets and resource reads the authorization policy denied, by action and "
            'the policy that decided (policy="" when no policy permits it)',
            ["action", "policy"],
            registry=self.registry,
        )
        self.indexer_seconds = Histogram(
            "toolsearch_router_indexer_call_duration_seconds",
            "Indexer gRPC call latency by method and status code",
            ["method", "code"],
            buckets=_INDEXER_BUCKETS,
            registry=self.registry,
        )

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def observe_tool_calls(self, handler: Handler) -> Handler:
        """Wrap a `tools/call` handler so each call is counted and timed by meta-tool and outcome."""

        async def observed(ctx: Any, params: Any, *rest: Any) -> Any:
            name = getattr(params, "name", "")
            tool = name if name in TOOLS else "other"
            started = time.perf_counter()
            outcome = "error"
            try:
                result = await handler(ctx, params, *rest)
                outcome = call_outcome(result)
                return result
            finally:
                self.tool_calls.labels(tool, outcome).inc()
                self.tool_seconds.labels(tool, outcome).observe(time.perf_counter() - started)

        return observed

    def indexer_interceptor(self) -> grpc.aio.UnaryUnaryClientInterceptor:
        """A client interceptor timing each indexer call and passing the request id on."""
        return _IndexerCalls(self.indexer_seconds, self.denials)


class _IndexerCalls(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, histogram: Histogram, denials: Counter) -> None:
        self._histogram = histogram
        self._denials = denials  # counted here, once per denial the indexer reports

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        details = client_call_details
        if request_id := current_request_id():
            pairs = [tuple(pair) for pair in (details.metadata or ())]
            details = details._replace(metadata=grpc.aio.Metadata(*pairs, (REQUEST_ID_HEADER, request_id)))
        started = time.perf_counter()
        code = "UNKNOWN"
        try:
            call = await continuation(details, request)
            await call
            code = "OK"
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            if (denied := denial_of(exc, request)) is not None:
                for policy in denied.policies or ("",):
                    self._denials.labels(denied.action, policy).inc()
            raise
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        finally:
            self._histogram.labels(rpc_name(details.method), code).observe(time.perf_counter() - started)
        return call


class RequestObserver:
    """The outermost ASGI layer: a request id for the logs, and each HTTP request counted and timed."""

    def __init__(self, app: ASGIApp, metrics: RouterMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = clean_request_id(Headers(scope=scope).get(REQUEST_ID_HEADER)) or uuid.uuid4().hex[:16]
        status = 500  # unless a response starts: the app failed before answering

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [*message.get("headers", []), (REQUEST_ID_HEADER.encode(), request_id.encode())]
                message = {**message, "headers": headers}
            await send(message)

        path = scope.get("path", "")
        route = path if path in ROUTES else "other"
        method = scope.get("method", "")
        started = time.perf_counter()
        try:
            with bound(request=request_id):
                await self.app(scope, receive, send_with_id)
        finally:
            method = method if method in HTTP_METHODS else "other"
            self.metrics.http_requests.labels(route, method, str(status)).inc()
            self.metrics.http_seconds.labels(route).observe(time.perf_counter() - started)
