"""The backend registry: every configured backend, its last listing, and whether it is advertised.

Backends whose outgoing auth does not depend on the caller (`none`, `header`) are listed once here
and the listing is shared by every session; `passthrough` backends are listed per session with the
caller's token (see `indexer.sessions`). The health monitor updates the statuses kept here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import httpx2

from indexer.discovery import Listing, ProbeClient, list_tools, pinned_mode
from indexer.errors import BackendError, BackendRejected, BackendUnavailable, InvalidRequest
from toolsearch.config import Backend

Status = Literal["healthy", "degraded", "unhealthy", "unknown", "unauthenticated"]
ADVERTISED: frozenset[str] = frozenset({"healthy", "degraded"})


def listing_digest(listing: Listing) -> str:
    """A hash of a listing's tools, to tell a changed tool list from the same one."""
    text = json.dumps(listing.tools, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass
class BackendState:
    """What the indexer knows of one backend now."""

    config: Backend
    status: Status = "unknown"
    listing: Listing | None = None
    digest: str = ""
    protocol_version: str = ""
    latency: float = 0.0
    last_error: str = ""
    consecutive_failures: int = 0
    circuit: str = ""
    checked_at: float = field(default=0.0)
    # +1 each time the backend becomes advertised: what was listed before may be stale (its tools,
    # or whether a stored token is still accepted), so sessions relist passthrough backends then
    epoch: int = 0

    @property
    def advertised(self) -> bool:
        return self.status in ADVERTISED

    def set_status(self, status: Status) -> None:
        """Record a verdict; becoming advertised starts a new epoch."""
        if status in ADVERTISED and not self.advertised:
            self.epoch += 1
        self.status = status


class MissingCredentials(InvalidRequest):
    """Raised when a passthrough backend is listed for a caller who sent no bearer token."""


class Registry:
    """The configured backends and what was last learned of each."""

    def __init__(
        self,
        backends: Sequence[Backend],
        secrets: Mapping[str, str],
        timeout: float,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._secrets = secrets
        self._timeout = timeout
        self._transport = transport
        self.states: dict[str, BackendState] = {b.id: BackendState(config=b) for b in backends}
        self._listeners: list[Callable[[str], None]] = []
        self._probe_clients: dict[str, ProbeClient] = {}  # one per probed backend, kept across probes

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call `listener(reason)` whenever what a session may see of the backends changes."""
        self._listeners.append(listener)

    def changed(self, reason: str) -> None:
        for listener in self._listeners:
            listener(reason)

    def get(self, backend_id: str) -> BackendState:
        return self.states[backend_id]

    def headers(self, backend: Backend, token: str | None) -> dict[str, str]:
        """The outgoing auth headers for one backend and caller; never logged."""
        auth = backend.auth
        if auth.type == "header":
            value = self._secrets.get(auth.value_env or "")
            return {auth.header: value} if value else {}
        if auth.type == "passthrough":
            if not token:
                raise MissingCredentials(f"backend {backend.id} needs the caller's bearer token")
            return {auth.header: f"Bearer {token}"}
        return {}

    async def list_backend(
        self, backend: Backend, token: str | None = None, timeout: float | None = None
    ) -> Listing:
        """List one backend's tools with the given caller token (for passthrough backends)."""
        return await list_tools(
            backend.id,
            backend.url,
            self.headers(backend, token),
            min(timeout or self._timeout, backend.timeout),
            transport=self._transport,
        )

    def add(self, backend: Backend) -> BackendState:
        """Register a backend (or replace one with the same id); its status is unknown until listed."""
        state = BackendState(config=backend)
        self.states[backend.id] = state
        return state

    def remove(self, backend_id: str) -> None:
        """Forget a backend; sessions stop seeing its tools at their next rebuild."""
        self.states.pop(backend_id, None)

    async def probe(self, backend: Backend, timeout: float) -> Listing:
        """List a backend as a health probe: with its own credentials, or none for passthrough ones.

        While the backend answers, a probe reuses its HTTP client and speaks the protocol version it
        answered in last, without negotiating again. After a failure it negotiates ("auto"), and a
        pinned version the backend now refuses is retried with negotiation in the time left, so a
        backend that changed its protocol is not counted as failing.
        """
        timeout = min(timeout, backend.timeout)
        # No caller is at hand for a passthrough backend: a 401/403 (BackendRejected) then still
        # proves it answers.
        headers = {} if backend.auth.type == "passthrough" else self.headers(backend, None)
        state = self.states.get(backend.id)
        if state is None or state.config is not backend:
            # removed or replaced meanwhile: nothing to pin, no client to keep
            return await list_tools(backend.id, backend.url, headers, timeout, transport=self._transport)
        mode = pinned_mode(state.protocol_version) if state.consecutive_failures == 0 else "auto"
        client, stale = self._claim_probe_client(backend.id, headers, timeout)
        try:
            if stale is not None:
                await stale.aclose()
            started = time.perf_counter()
            try:
                return await list_tools(
                    backend.id, backend.url, headers, timeout, self._transport, mode=mode, client=client
                )
            except BackendUnavailable as refused:
                left = timeout - (time.perf_counter() - started)
                if mode == "auto" or left <= 0:
                    raise
                with contextlib.suppress(BackendUnavailable):
                    return await list_tools(
                        backend.id, backend.url, headers, left, self._transport, client=client
                    )
                # the retry was only in case the protocol changed: report what the probe itself met
                raise refused
        finally:
            if client is not None:
                client.busy = False

    def _claim_probe_client(
        self, backend_id: str, headers: Mapping[str, str], timeout: float
    ) -> tuple[ProbeClient | None, ProbeClient | None]:
        """Claim the backend's kept probe client; returns it and a replaced one for the caller to close.

        A client is built anew when the headers or timeout changed. While another probe of the same
        backend holds it, there is none to claim (None): that listing builds a client of its own.
        """
        client = self._probe_clients.get(backend_id)
        if client is not None and client.busy:
            return None, None
        stale = None
        if client is None or not client.fits(headers, timeout):
            stale, client = client, ProbeClient(headers, timeout, self._transport)
            self._probe_clients[backend_id] = client
        client.busy = True
        return client, stale

    async def close_probe_client(self, backend_id: str) -> None:
        """Close a backend's kept probe client, when it is no longer probed."""
        client = self._probe_clients.pop(backend_id, None)
        if client is not None:
            await client.aclose()

    async def close_probe_clients(self) -> None:
        """Close every kept probe client (the shared transport stays open: its owner closes it)."""
        for backend_id in list(self._probe_clients):
            await self.close_probe_client(backend_id)

    def record_listing(self, backend_id: str, listing: Listing, status: Status = "healthy") -> bool:
        """Store a successful listing; returns whether the tool list changed."""
        state = self.states[backend_id]
        digest = listing_digest(listing)
        changed = digest != state.digest
        # An unchanged list keeps its Listing object: session catalogs are memoised by listing
        # identity, so a probe that finds nothing new must not look like a new catalog.
        if changed or state.listing is None:
            state.listing = listing
        state.digest = digest
        state.protocol_version = listing.protocol_version
        state.latency = listing.latency
        state.set_status(status)
        state.last_error = ""
        state.consecutive_failures = 0
        state.checked_at = time.time()
        return changed

    def record_answer(self, backend_id: str, latency: float, status: Status) -> None:
        """Store that a backend answered, without a listing to keep (passthrough backends)."""
        state = self.states[backend_id]
        state.set_status(status)
        state.latency = latency
        state.last_error = ""
        state.consecutive_failures = 0
        state.checked_at = time.time()

    def record_failure(self, backend_id: str, error: BackendError, status: Status) -> None:
        state = self.states[backend_id]
        state.set_status(status)
        state.last_error = error.reason
        state.consecutive_failures += 1
        state.checked_at = time.time()

    async def discover(self, backend_id: str) -> None:
        """List one caller-independent backend and record the outcome."""
        state = self.states[backend_id]
        backend = state.config
        if backend.auth.type == "passthrough":
            # Listed per caller; here only whether it answers at all matters.
            started = time.perf_counter()
            try:
                await list_tools(
                    backend.id,
                    backend.url,
                    {},
                    min(self._timeout, backend.timeout),
                    transport=self._transport,
                )
            except BackendRejected:
                self.record_answer(backend_id, time.perf_counter() - started, "healthy")
            except BackendError as exc:
                self.record_failure(backend_id, exc, "unhealthy")
            else:
                self.record_answer(backend_id, time.perf_counter() - started, "healthy")
            return
        try:
            listing = await self.list_backend(backend)
        except BackendRejected as exc:
            self.record_failure(backend_id, exc, "unauthenticated")
        except BackendError as exc:
            self.record_failure(backend_id, exc, "unhealthy")
        else:
            self.record_listing(backend_id, listing)

    async def discover_all(self) -> None:
        """List every backend at once; a backend that fails is left out until it recovers."""
        await asyncio.gather(*(self.discover(backend_id) for backend_id in self.states))
