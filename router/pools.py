"""The router's connections to backends: a pool per backend, so a backend that hangs holds only its own.

Each backend id gets its own `httpx2.AsyncHTTPTransport` of `router.max_connections_per_backend`
connections, made on first use and closed with the application. A call waits for a free
connection of its backend's pool no longer than its own deadline (the backend's `timeout`), so a
backend whose calls all hang costs its own callers that timeout while calls to other backends find
their pools free. Backend ids come from the configuration the indexer serves, so the pools are as
many as the backends.

A test may hand in one transport for every backend instead; the application then leaves closing it
to the test.
"""

from __future__ import annotations

import httpx2

# Idle connections go after 30 s, and each pool keeps at most this many of them open.
_KEEPALIVE_EXPIRY = 30.0
_MAX_KEEPALIVE = 20


class BackendPools:
    """One connection pool per backend, `per_backend` connections each; or one `shared` transport."""

    def __init__(self, per_backend: int, shared: httpx2.AsyncBaseTransport | None = None) -> None:
        self._limits = httpx2.Limits(
            max_connections=per_backend,
            max_keepalive_connections=min(per_backend, _MAX_KEEPALIVE),
            keepalive_expiry=_KEEPALIVE_EXPIRY,
        )
        self._shared = shared
        self._pools: dict[str, httpx2.AsyncHTTPTransport] = {}

    def for_backend(self, backend_id: str) -> httpx2.AsyncBaseTransport:
        """The pool calls to `backend_id` go through."""
        if self._shared is not None:
            return self._shared
        pool = self._pools.get(backend_id)
        if pool is None:
            pool = self._pools[backend_id] = httpx2.AsyncHTTPTransport(limits=self._limits)
        return pool

    async def aclose(self) -> None:
        """Close every pool made here (a shared transport is its owner's to close)."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()
