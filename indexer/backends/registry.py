"""The backend registry: every configured backend, its last listing, and what its health is now.

Backends whose outgoing auth does not depend on the caller (`none`, `header`) are listed once here
and the listing is shared by every session; `passthrough` backends are listed per session with the
caller's token (see `indexer.credentials`). Every change goes through a method of the registry,
which replaces the backend's `BackendState` whole: the health monitor records its verdicts here
(`record_listing`, `record_answer`, `record_failure`, `set_circuit`), a follower replica adopts the
lease holder's (`adopt`), a config reload adds and removes backends. Readers get `states`, a
read-only view, so none of them can change a backend behind the registry's rules (the epoch).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import httpx2

from indexer.backends.discovery import ProbeClient, list_tools, pinned_mode
from indexer.errors import BackendError, BackendRejected, BackendUnavailable, NoCallerToken
from indexer.state.backends import ADVERTISED, BackendHealth, Status
from indexer.state.listings import Listing, listing_digest
from toolsearch.backend_settings import Backend


@dataclass(frozen=True, slots=True)
class BackendState:
    """What the indexer knows of one backend now: its configuration, health and last listing."""

    config: Backend
    health: BackendHealth = field(default_factory=BackendHealth)
    listing: Listing | None = None  # kept while the backend is down: its tools return with it

    @property
    def advertised(self) -> bool:
        return self.health.advertised

    @property
    def status(self) -> Status:
        return self.health.status


def _verdict(health: BackendHealth, status: Status) -> BackendHealth:
    """`health` with a new status, judged now; becoming advertised starts a new epoch."""
    epoch = health.epoch + 1 if status in ADVERTISED and not health.advertised else health.epoch
    return replace(health, status=status, epoch=epoch, checked_at=time.time())


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
        self._states: dict[str, BackendState] = {b.id: BackendState(config=b) for b in backends}
        self._view = MappingProxyType(self._states)
        self._probe_clients: dict[str, ProbeClient] = {}  # one per probed backend, kept across probes

    @property
    def states(self) -> Mapping[str, BackendState]:
        """Every backend's state, by id: a read-only view that follows the registry's changes."""
        return self._view

    def get(self, backend_id: str) -> BackendState:
        return self._states[backend_id]

    def headers(self, backend: Backend, token: str | None) -> dict[str, str]:
        """The outgoing auth headers for one backend and caller; never logged."""
        auth = backend.auth
        if auth.type == "header":
            value = self._secrets.get(auth.value_env or "")
            return {auth.header: value} if value else {}
        if auth.type == "passthrough":
            if not token:
                raise NoCallerToken(f"backend {backend.id} needs the caller's bearer token")
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
            max_response_bytes=backend.max_response_bytes,
            mcp_transport=backend.transport,
        )

    def add(self, backend: Backend) -> BackendState:
        """Register a backend (or replace one with the same id); its status is unknown until listed."""
        state = BackendState(config=backend)
        self._states[backend.id] = state
        return state

    def remove(self, backend_id: str) -> None:
        """Forget a backend; sessions stop seeing its tools at their next rebuild."""
        self._states.pop(backend_id, None)

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
        state = self._states.get(backend.id)
        if state is None or state.config is not backend:
            # removed or replaced meanwhile: nothing to pin, no client to keep
            return await list_tools(
                backend.id,
                backend.url,
                headers,
                timeout,
                transport=self._transport,
                max_response_bytes=backend.max_response_bytes,
                mcp_transport=backend.transport,
            )
        mode = (
            pinned_mode(state.health.protocol_version) if state.health.consecutive_failures == 0 else "auto"
        )
        client, stale = self._claim_probe_client(backend.id, headers, timeout, backend.max_response_bytes)
        try:
            if stale is not None:
                await stale.aclose()
            started = time.perf_counter()
            try:
                return await list_tools(
                    backend.id,
                    backend.url,
                    headers,
                    timeout,
                    self._transport,
                    mode=mode,
                    client=client,
                    mcp_transport=backend.transport,
                )
            except BackendUnavailable as refused:
                left = timeout - (time.perf_counter() - started)
                if mode == "auto" or left <= 0:
                    raise
                with contextlib.suppress(BackendUnavailable):
                    return await list_tools(
                        backend.id,
                        backend.url,
                        headers,
                        left,
                        self._transport,
                        client=client,
                        mcp_transport=backend.transport,
                    )
                # the retry was only in case the protocol changed: report what the probe itself met
                raise refused
        finally:
            if client is not None:
                client.busy = False

    def _claim_probe_client(
        self, backend_id: str, headers: Mapping[str, str], timeout: float, max_response_bytes: int
    ) -> tuple[ProbeClient | None, ProbeClient | None]:
        """Claim the backend's kept probe client; returns it and a replaced one for the caller to close.

        A client is built anew when the headers or timeout changed. While another probe of the same
        backend holds it, there is none to claim (None): that listing builds a client of its own.
        """
        client = self._probe_clients.get(backend_id)
        if client is not None and client.busy:
            return None, None
        stale = None
        if client is None or not client.fits(headers, timeout, max_response_bytes):
            stale, client = client, ProbeClient(headers, timeout, self._transport, max_response_bytes)
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
        state = self._states[backend_id]
        digest = listing_digest(listing)
        changed = digest != state.health.digest
        # An unchanged list keeps its Listing object: session catalogs are memoised by listing
        # identity, so a probe that finds nothing new must not look like a new catalog.
        kept = state.listing if state.listing is not None and not changed else listing
        health = replace(
            _verdict(state.health, status),
            digest=digest,
            protocol_version=listing.protocol_version,
            latency=listing.latency,
            last_error="",
            consecutive_failures=0,
        )
        self._states[backend_id] = replace(state, health=health, listing=kept)
        return changed

    def record_answer(self, backend_id: str, latency: float, status: Status) -> None:
        """Store that a backend answered, without a listing to keep (passthrough backends)."""
        state = self._states[backend_id]
        health = replace(
            _verdict(state.health, status), latency=latency, last_error="", consecutive_failures=0
        )
        self._states[backend_id] = replace(state, health=health)

    def record_failure(self, backend_id: str, error: BackendError, status: Status) -> None:
        state = self._states[backend_id]
        failures = state.health.consecutive_failures + 1
        health = replace(
            _verdict(state.health, status), last_error=error.reason, consecutive_failures=failures
        )
        self._states[backend_id] = replace(state, health=health)

    def set_circuit(self, backend_id: str, circuit: str) -> None:
        """Store the state of the backend's circuit breaker ("closed", "open", "half-open")."""
        state = self._states[backend_id]
        self._states[backend_id] = replace(state, health=replace(state.health, circuit=circuit))

    def adopt(self, backend_id: str, health: BackendHealth, listing: Listing | None = None) -> None:
        """Take the lease holder's verdict on a backend as it is, epoch included (a follower judges nothing).

        `listing` is the one `health.digest` names, given when this replica did not hold it yet.
        Without it the backend keeps its listing and that listing's digest: a digest always names
        the listing held. A backend this replica's configuration lacks is ignored.
        """
        state = self._states.get(backend_id)
        if state is None:
            return
        if listing is None:
            listing, health = state.listing, replace(health, digest=state.health.digest)
        self._states[backend_id] = replace(state, health=health, listing=listing)

    async def discover(self, backend_id: str) -> None:
        """List one caller-independent backend and record the outcome."""
        state = self._states[backend_id]
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
                    max_response_bytes=backend.max_response_bytes,
                    mcp_transport=backend.transport,
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
        await asyncio.gather(*(self.discover(backend_id) for backend_id in self._states))
