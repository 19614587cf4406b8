"""The router's connections to backends: a pool per backend, so a backend that hangs holds only its own.

Each backend id gets its own `httpx2.AsyncHTTPTransport` of `router.max_connections_per_backend`
connections, made on first use and closed with the application. A call waits for a free
connection of its backend's pool no longer than its own deadline (the backend's `timeout`), so a
backend whose calls all hang costs its own callers that timeout while calls to other backends find
their pools free. Backend ids come from the configuration the indexer serves, so the pools are as
many as the backends.

Long-lived streams (a backend session's standalone stream, which a client's own standalone stream
holds open: router/upstream/session_wide/backend_streams.py) go through a second pool per backend, of
`MAX_STREAMS` connections, so that they never take the connections calls need.

A test may hand in one transport for every backend instead; the application then leaves closing it
to the test. Every request goes through `TracedTransport`: with traces on (toolsearch/tracing.py)
it is a CLIENT span, and the backend gets its context as a `traceparent` header.
"""

from __future__ import annotations

import httpx2
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, StatusCode

# Idle connections go after 4 s, before the servers' own idle timeouts (uvicorn's and Node's are
# 5 s): a connection a backend closes while a request is being sent on it fails that request as a
# dropped connection, and a POST cannot be sent again safely. Each pool keeps at most this many.
_KEEPALIVE_EXPIRY = 4.0
_MAX_KEEPALIVE = 20
MAX_STREAMS = 1000  # long-lived streams open to one backend at once, at most


_tracer = trace.get_tracer("toolsearch.router")


class TracedTransport(httpx2.AsyncBaseTransport):
    """A backend's transport whose requests are spans and carry their trace context."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, backend_id: str, owned: bool = True) -> None:
        self.inner = inner
        self.backend_id = backend_id
        self.owned = owned  # whether closing this closes `inner`

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        with _tracer.start_as_current_span(f"backend {self.backend_id}", kind=SpanKind.CLIENT) as span:
            if span.is_recording():
                span.set_attributes(
                    {
                        "toolsearch.backend": self.backend_id,
                        "http.request.method": request.method,
                        "server.address": request.url.host,
                    }
                )
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            for key, value in carrier.items():
                request.headers[key] = value
            response = await self.inner.handle_async_request(request)
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                span.set_status(StatusCode.ERROR, f"HTTP {response.status_code}")
            return response

    async def aclose(self) -> None:
        if self.owned:
            await self.inner.aclose()


class BackendPools:
    """One connection pool per backend, `per_backend` connections each; or one `shared` transport."""

    def __init__(self, per_backend: int, shared: httpx2.AsyncBaseTransport | None = None) -> None:
        self._limits = httpx2.Limits(
            max_connections=per_backend,
            max_keepalive_connections=min(per_backend, _MAX_KEEPALIVE),
            keepalive_expiry=_KEEPALIVE_EXPIRY,
        )
        self._shared = shared
        self._pools: dict[str, TracedTransport] = {}
        self._streams: dict[str, TracedTransport] = {}

    def for_backend(self, backend_id: str) -> httpx2.AsyncBaseTransport:
        """The pool calls to `backend_id` go through."""
        if self._shared is not None:
            return TracedTransport(self._shared, backend_id, owned=False)
        pool = self._pools.get(backend_id)
        if pool is None:
            inner = httpx2.AsyncHTTPTransport(limits=self._limits)
            pool = self._pools[backend_id] = TracedTransport(inner, backend_id)
        return pool

    def for_streams(self, backend_id: str) -> httpx2.AsyncBaseTransport:
        """The pool long-lived streams from `backend_id` go through, apart from its calls'."""
        if self._shared is not None:
            return TracedTransport(self._shared, backend_id, owned=False)
        pool = self._streams.get(backend_id)
        if pool is None:
            inner = httpx2.AsyncHTTPTransport(limits=httpx2.Limits(max_connections=MAX_STREAMS))
            pool = self._streams[backend_id] = TracedTransport(inner, backend_id)
        return pool

    async def aclose(self) -> None:
        """Close every pool made here (a shared transport is its owner's to close)."""
        pools = [*self._pools.values(), *self._streams.values()]
        self._pools, self._streams = {}, {}
        for pool in pools:
            await pool.aclose()
