"""The backend lister: every request the indexer makes to list a backend's tools, and what it learns.

Listing is the indexer's one kind of backend I/O (MCP `initialize` + `tools/list`): at start and on a
config reload (`discover`), per session with the caller's credentials (`list_backend`, for
passthrough and token_exchange backends: the caller's token, or the one exchanged for it), and on
the health monitor's interval (`probe`). It needs the backends' secrets, the
discovery timeout, the shared connection pool and, for probes, one kept HTTP client per backend;
none of that is state the rest of the indexer reads, so it lives here, apart from the `Registry`.
What a listing learns is recorded through the registry's methods, which keep its rules (the epoch):
the lister holds no verdict of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping

import httpx2

from indexer.backends.backend_tokens import BackendTokens
from indexer.backends.discovery import ProbeClient, list_tools, pinned_mode
from indexer.backends.registry import Registry
from indexer.backends.token_exchange import TokenEndpoints
from indexer.errors import (
    BackendError,
    BackendRejected,
    BackendSecretUnset,
    BackendUnavailable,
    NoCallerToken,
)
from indexer.state import LocalTokens
from indexer.state.listings import Listing
from toolsearch.outgoing import MissingCallerToken, MissingSecret, auth_headers, per_caller
from toolsearch.readiness import cut_at
from toolsearch.sections.backend_settings import Backend
from toolsearch.sessions import Principal


class BackendLister:
    """Lists, probes and discovers the registry's backends, and records the outcomes in it."""

    def __init__(
        self,
        registry: Registry,
        secrets: Mapping[str, str],
        timeout: float,
        transport: httpx2.AsyncBaseTransport | None = None,
        tokens: BackendTokens | None = None,
    ) -> None:
        self._registry = registry
        self._secrets = secrets
        # the tokens of token_exchange backends (by default kept in this process only)
        self.backend_tokens = tokens or BackendTokens(TokenEndpoints(secrets), LocalTokens())
        self._timeout = timeout
        self._transport = transport
        self._probe_clients: dict[str, ProbeClient] = {}  # one per probed backend, kept across probes

    @property
    def registry(self) -> Registry:
        """The registry this lister lists the backends of, and records what it learns in."""
        return self._registry

    async def headers(
        self, backend: Backend, token: str | None, principal: Principal | None = None
    ) -> dict[str, str]:
        """One backend's auth headers for a caller (toolsearch/outgoing.py); never logged.

        A token_exchange backend's are the token exchanged for `token` (kept per `principal`);
        the exchange's errors (`ExchangeRefused`, `ExchangeFailed`) count as the backend's would.
        """
        exchanged = None
        if backend.auth.type == "token_exchange":
            exchanged = await self.backend_tokens.token_for(backend, principal, token)
        try:
            return auth_headers(backend.id, backend.auth, self._secrets, token, exchanged)
        except MissingSecret as exc:
            raise BackendSecretUnset(backend.id, exc.reason) from None
        except MissingCallerToken:
            raise NoCallerToken(f"backend {backend.id} needs the caller's bearer token") from None

    async def list_backend(
        self,
        backend: Backend,
        token: str | None = None,
        timeout: float | None = None,
        principal: Principal | None = None,
    ) -> Listing:
        """List one backend's tools with the given caller's credentials (for per-caller backends)."""
        return await list_tools(
            backend.id,
            backend.url,
            await self.headers(backend, token, principal),
            min(timeout or self._timeout, backend.timeout),
            transport=self._transport,
            max_response_bytes=backend.max_response_bytes,
        )

    async def probe(self, backend: Backend, timeout: float) -> Listing:
        """List a backend as a health probe: with its own credentials, or none for per-caller ones.

        While the backend answers, a probe reuses its HTTP client and speaks the protocol version it
        answered in last, without negotiating again. After a failure it negotiates ("auto"), and a
        pinned version the backend now refuses is retried with negotiation in the time left, so a
        backend that changed its protocol is not counted as failing.
        """
        timeout = min(timeout, backend.timeout)
        # No caller is at hand for a passthrough or token_exchange backend, and no token of our own
        # is minted for it: a 401/403 (BackendRejected) then still proves it answers.
        headers = {} if per_caller(backend.auth) else await self.headers(backend, None)
        state = self._registry.states.get(backend.id)
        if state is None or state.config is not backend:
            # removed or replaced meanwhile: nothing to pin, no client to keep
            return await list_tools(
                backend.id,
                backend.url,
                headers,
                timeout,
                transport=self._transport,
                max_response_bytes=backend.max_response_bytes,
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

    async def discover(self, backend_id: str) -> None:
        """List one caller-independent backend and record the outcome."""
        registry = self._registry
        backend = registry.get(backend_id).config
        if per_caller(backend.auth):
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
                )
            except BackendRejected:
                registry.record_answer(backend_id, time.perf_counter() - started, "healthy")
            except BackendError as exc:
                registry.record_failure(backend_id, exc, "unhealthy")
            else:
                registry.record_answer(backend_id, time.perf_counter() - started, "healthy")
            return
        try:
            listing = await self.list_backend(backend)
        except BackendRejected as exc:
            registry.record_failure(backend_id, exc, "unauthenticated")
        except BackendError as exc:
            registry.record_failure(backend_id, exc, "unhealthy")
        else:
            registry.record_listing(backend_id, listing)

    async def discover_all(self, wait_for_all: bool = True) -> None:
        """List every backend at once; a backend that fails is left out until it recovers.

        Unless `wait_for_all`, a backend far slower than the others (toolsearch/readiness.py) is not
        waited for: its listing is given up and it is `unhealthy` ("still starting") until a probe
        finds it answering, so one server that never answers holds nobody's start.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        pending = {asyncio.ensure_future(self.discover(b)): b for b in self._registry.states}
        done_at: list[float] = []
        while pending:
            wait = (
                None if wait_for_all or not done_at else max(0.0, cut_at(done_at) - (loop.time() - started))
            )
            done, _ = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break
            for task in done:
                del pending[task]
                task.result()
                done_at.append(loop.time() - started)
        for task, backend_id in pending.items():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            waited = loop.time() - started
            reason = f"still starting: no listing within {waited:.1f}s, while the others answered sooner"
            self._registry.record_failure(backend_id, BackendUnavailable(backend_id, reason), "unhealthy")
