"""Tokens for token_exchange backends: exchanged once per principal and backend, kept while they live.

A caller's token is exchanged (indexer/backends/token_exchange.py) the first time one of its requests
needs the backend: a router's call (the `ExchangeToken` call) or a session's listing. The token it
gets is kept in the state (indexer/state/tokens.py, Redis when replicas share it) until
`REFRESH_MARGIN` seconds before it expires (a short-lived one, for half its life), so every router
replica and indexer replica uses it; concurrent requests of one principal on one indexer wait for
the one exchange in flight instead of each starting its own.

The key names the principal as the router verified it (issuer and subject), so a refreshed caller
token keeps the exchanged one. A caller nobody verified (a token holder of an anonymous router) has
no principal to name: its key is a digest of the token itself, so no two such callers share one.
The key also names the backend's exchange settings, so a reload that changes them never reuses a
token minted for the old ones. Only digests go into keys; tokens appear in no log.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging

from indexer.backends.token_exchange import TokenEndpoints
from indexer.errors import NoCallerToken
from indexer.state import TokenStore
from toolsearch.sections.backend_settings import Backend
from toolsearch.sessions import Principal

logger = logging.getLogger(__name__)

REFRESH_MARGIN = 30.0  # seconds before its expiry an exchanged token is exchanged again
LONGEST_KEPT = 86_400.0  # seconds a token is kept at most, whatever its lifetime


def kept_for(lifetime: float) -> float:
    """How long a token living `lifetime` seconds is used: until the margin, or half its life."""
    return min(lifetime - min(REFRESH_MARGIN, lifetime / 2), LONGEST_KEPT)


def token_key(backend: Backend, principal: Principal | None, subject_token: str) -> str:
    """The key of the token exchanged for `principal` at `backend`: a digest, naming nobody."""
    auth = backend.auth
    settings = [backend.id, auth.token_url, auth.audience, sorted(auth.scopes), auth.client_id_env]
    if principal is not None and principal.issuer:
        who = ["principal", principal.issuer, principal.subject]
    else:
        who = ["token", hashlib.sha256(subject_token.encode()).hexdigest()]
    return hashlib.sha256(json.dumps([settings, who]).encode()).hexdigest()


class BackendTokens:
    """The tokens of token_exchange backends, kept in `store` and exchanged at `endpoints`."""

    def __init__(self, endpoints: TokenEndpoints, store: TokenStore) -> None:
        self.endpoints = endpoints
        self._store = store
        self._flights: dict[str, asyncio.Future[str]] = {}  # one exchange in flight per key

    async def token_for(
        self, backend: Backend, principal: Principal | None, subject_token: str | None, renew: bool = False
    ) -> str:
        """The token for `backend` on behalf of the caller holding `subject_token`.

        `renew`: the one kept was refused by the backend; it is dropped and exchanged anew.
        Raises `NoCallerToken`, `ExchangeRefused` or `ExchangeFailed` (indexer/errors.py).
        """
        if not subject_token:
            raise NoCallerToken(f"backend {backend.id} needs the caller's bearer token to exchange")
        key = token_key(backend, principal, subject_token)
        flight = self._flights.get(key)
        if flight is None:
            if renew:
                await self._store.drop(key)
            elif (kept := await self._store.get(key)) is not None:
                return kept
            flight = self._flights.get(key)  # another request may have started one meanwhile
        if flight is None:
            flight = asyncio.ensure_future(self._exchange(key, backend, subject_token))
            self._flights[key] = flight
            flight.add_done_callback(lambda done: self._landed(key, done))
        # shielded: a caller that gives up does not cancel the exchange the others wait for
        return await asyncio.shield(flight)

    async def _exchange(self, key: str, backend: Backend, subject_token: str) -> str:
        exchanged = await self.endpoints.exchange(backend, subject_token)
        ttl = kept_for(exchanged.lifetime)
        if ttl > 0:
            await self._store.put(key, exchanged.token, ttl)
        return exchanged.token

    def _landed(self, key: str, done: asyncio.Future[str]) -> None:
        if self._flights.get(key) is done:
            del self._flights[key]
        if not done.cancelled():
            done.exception()  # retrieved: every waiter may have given up

    async def aclose(self) -> None:
        for flight in list(self._flights.values()):
            flight.cancel()
        await asyncio.gather(*self._flights.values(), return_exceptions=True)
        await self.endpoints.aclose()
