"""Calling backend tools over MCP (Streamable HTTP), with pooled connections and a deadline per call.

A call takes its backend as one `BackendTarget` (toolsearch/targets.py), read from the indexer's answer
by the link with the defaults applied: where it is, its auth, its timeout and size bound, its
protocol, and the client session's backend session there.

Arguments are checked against the tool's input schema first (`SchemaValidators`, router/handlers/schemas.py),
so a call the backend would refuse never leaves the router.

Each backend has its own connection pool (router/upstream/wire/pools.py) for as long as the application runs;
each call wraps its backend's pool in a lightweight `httpx2.AsyncClient` carrying that call's
headers and timeout, through a `BoundedTransport` (toolsearch/responses.py) that cuts the answer at
the backend's `max_response_bytes` while it is read. The SDK leaves a client it was given open, and
the per-call client is never closed either: the pool is the application's.

A handshake-era backend is called inside the client session's backend session (router/
backend_messages.py): opened at the session's first call to it, kept in the indexer, reused by every
replica, ended by the indexer when the client session ends. A backend that spoke 2026-07-28 at
discovery is called with one stamped request of the router's own (router/upstream/wire/modern.py); a
legacy SSE backend is a handshake-era one at the bridge, which holds its sessions. Every result
comes back as the backend sent it: only its being a JSON object is checked
(router/handlers/passthrough.py carries it to the client). Requests other than tools/call
(`request`: resources, prompts, completions; router/upstream/session_wide/backend_requests.py) take the very
same ways; which of them a request takes is router/upstream/wire/exchanges.py's choice.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import anyio
import httpx2
import mcp_types as types

from router.caller import NOTHING_DECLARED, Declared
from router.errors import (
    BackendError,
    BackendSessionGone,
    MissingCredentials,
)
from router.upstream.wire.backend_messages import BackendMessenger
from router.upstream.wire.exchanges import Exchanges, OnOpen, translated
from router.upstream.wire.pools import BackendPools
from router.upstream.wire.relays import ClientAsker, NotificationRelay
from toolsearch.outgoing import AuthSettings, OutgoingAuthError, auth_headers
from toolsearch.responses import BoundedTransport
from toolsearch.sessions import BackendSession
from toolsearch.targets import BackendTarget

logger = logging.getLogger(__name__)

_NOTICE_BYTES = 65_536  # the most an answer to a notification or a DELETE may weigh
_END_WITHIN = 2.0  # seconds an unkept session's DELETE may take


def outgoing_headers(
    backend_id: str,
    auth: AuthSettings,
    secrets: Mapping[str, str],
    bearer_token: str | None,
    exchanged: str | None = None,
) -> dict[str, str]:
    """The headers that authenticate a call to a backend (toolsearch/outgoing.py); `exchanged` is a
    token_exchange backend's token (router/upstream/calls/credentials.py).

    Raises `MissingCredentials` for a missing secret or caller token, before anything is sent.
    """
    try:
        return auth_headers(backend_id, auth, secrets, bearer_token, exchanged)
    except OutgoingAuthError as exc:
        raise MissingCredentials(backend_id, exc.reason) from None


class CallOutcome(NamedTuple):
    """A call's result as the wire has it, the backend session it ran in (None: none kept), and,
    when the session it was to run in was gone and a new one replaced it, why (else "")."""

    result: dict[str, Any]
    session: BackendSession | None
    replaced: str = ""


class RequestOutcome(NamedTuple):
    """A request's result as the wire has it, the backend session it ran in (None: none kept), and
    why a new session replaced a gone one ("" when none did)."""

    result: dict[str, Any]
    session: BackendSession | None
    replaced: str = ""


class BackendCaller:
    """Calls tools on backend MCP servers, each through its own backend's connection pool."""

    def __init__(self, pools: BackendPools) -> None:
        self._pools = pools
        self._exchanges = Exchanges()  # which era each request goes in, and its exchange

    def _client(
        self, backend_id: str, headers: Mapping[str, str], timeout_seconds: float, max_response_bytes: int
    ) -> tuple[httpx2.AsyncClient, BoundedTransport]:
        bounded = BoundedTransport(self._pools.for_backend(backend_id), max_response_bytes)
        http = httpx2.AsyncClient(
            transport=bounded, headers=dict(headers), timeout=httpx2.Timeout(timeout_seconds)
        )
        return http, bounded

    def refuses_sessions(self, target: BackendTarget) -> bool:
        """Whether a backend speaks 2026-07-28 only: it refused the handshake (so subscriptions too)."""
        return self._exchanges.refuses_sessions(target)

    def stream_client(self, target: BackendTarget, headers: Mapping[str, str]) -> httpx2.AsyncClient:
        """A client for a long-lived stream from `target` (a backend session's standalone stream):
        its backend's pool of streams, its timeout to connect and to answer, none between two
        events. Never closed: the pool is the application's."""
        timeout = httpx2.Timeout(target.timeout_seconds, read=None)
        transport = self._pools.for_streams(target.backend_id)
        return httpx2.AsyncClient(transport=transport, headers=dict(headers), timeout=timeout)

    async def call_tool(
        self,
        target: BackendTarget,
        name: str,
        arguments: Mapping[str, Any],
        headers: Mapping[str, str],
        *,
        relay: NotificationRelay | None = None,
        call_id: str | None = None,
        on_open: OnOpen | None = None,
        declared: Declared = NOTHING_DECLARED,
        retry: Mapping[str, Any] | None = None,
        asker: ClientAsker | None = None,
    ) -> CallOutcome:
        """Run `name` on the backend `target` names and return its result as it came.

        A handshake-era Streamable HTTP backend is called inside `target.session`, the client session's
        backend session (one POST); without one, or when the backend forgot it (404, once), a new
        one is opened first, and the outcome names it for the caller to keep. A 2026-07-28 backend
        gets one request, without a kept session.
        With a `relay`, the backend gets the client's progress token, and its progress and log
        notifications during the call go to the relay as they arrive. `call_id` is the id the call
        goes to a kept session with (`backend_request_id`), for `cancel` to name. `on_open` is given
        each session the call opens, before the call is sent in it, and says which to send it in.
        `declared` is what the client said of itself: a session opened gets its log level, and a
        backend that asks it for a capability it did not declare gets `CapabilityMissing` raised.
        `retry` is what a 2026-07-28 client's retry of an input-required call carries back to the
        backend (`inputResponses`, `requestState`), sent as it came. With an `asker`, what a
        handshake-era backend asks a 2026-07-28 client goes to it, and what a 2026-07-28 backend
        asks a handshake-era client in an input-required result is asked through it, the call sent
        again with the answers (router/upstream/rounds/input_rounds.py).

        Raises `BackendTimeout` after the target's `timeout_seconds`, `BackendRejected` on HTTP
        401/403, `BackendTooLarge` for an answer over its `max_response_bytes`, and
        `BackendUnavailable` or `BackendError` for anything else that keeps a result from coming back.
        """
        wire: dict[str, Any] = {**(retry or {}), "name": name, "arguments": dict(arguments)}
        if relay is not None and relay.progress_token is not None:
            wire["_meta"] = {"progressToken": relay.progress_token}
        messenger = self._messenger(target, headers, declared=declared, asker=asker)
        answer, session, replaced = await self._exchanges.send(
            messenger, target, "tools/call", wire, relay, call_id, on_open
        )
        return CallOutcome(without_meta_stamp(answer), session, replaced)

    async def request(
        self,
        target: BackendTarget,
        method: str,
        params: Mapping[str, Any],
        headers: Mapping[str, str],
        on_open: OnOpen | None = None,
        declared: Declared = NOTHING_DECLARED,
        relay: NotificationRelay | None = None,
        asker: ClientAsker | None = None,
    ) -> RequestOutcome:
        """Send one request other than tools/call (a listing, a read, a prompt, a completion).

        The same ways to the backend as `call_tool`, and the same errors: inside the client
        session's backend session for a handshake-era backend (a new one opened when there is none
        or it was forgotten), in a connection of its own for a 2026-07-28 backend (but see
        router/upstream/wire/exchanges.py). With a `relay` (a streamed answer), what the backend sends
        before its result goes to the client as during a call: its progress, its log messages, its
        requests of the client. With an `asker`, a 2026-07-28 client's: as input rounds
        (router/upstream/rounds/input_rounds.py).
        """
        messenger = self._messenger(target, headers, declared=declared, asker=asker)
        answer, kept, replaced = await self._exchanges.send(
            messenger, target, method, params, relay, None, on_open
        )
        return RequestOutcome(without_meta_stamp(answer), kept, replaced)

    async def notify(
        self,
        target: BackendTarget,
        headers: Mapping[str, str],
        method: str,
        params: Mapping[str, Any],
        timeout: float,
    ) -> None:
        """Send a notification inside the target's session (best effort, bounded); a target without
        a session has nothing of the client's to be told."""
        if target.session is None:
            return
        messenger = self._messenger(target, headers, timeout, _NOTICE_BYTES)
        with anyio.move_on_after(timeout):
            try:
                await messenger.notify(method, params, target.session)
            except (BackendError, httpx2.HTTPError) as exc:
                logger.debug("backend %s: passing on %s failed: %s", target.backend_id, method, exc)

    async def respond(
        self, target: BackendTarget, headers: Mapping[str, str], answer: Mapping[str, Any], timeout: float
    ) -> None:
        """Post a client's answer to a backend's request inside the target's session, within
        `timeout`; raises `BackendError`s (`BackendTimeout` when it takes longer)."""
        if target.session is None:
            raise BackendSessionGone(target.backend_id, "keeps no session of this client")
        messenger = self._messenger(target, headers, timeout, _NOTICE_BYTES)
        with translated(messenger, timeout):
            await messenger.respond(answer, target.session)

    async def set_level(
        self, target: BackendTarget, headers: Mapping[str, str], level: str, timeout: float
    ) -> None:
        """Pass a client's log level on to the target's session (best effort, bounded)."""
        if target.session is None:
            return
        messenger = self._messenger(target, headers, timeout, _NOTICE_BYTES)
        with anyio.move_on_after(timeout):
            try:
                await messenger.set_level(level, target.session)
            except (BackendError, httpx2.HTTPError) as exc:
                logger.debug("backend %s: passing on a log level failed: %s", target.backend_id, exc)

    async def end_session(
        self, target: BackendTarget, session: BackendSession, headers: Mapping[str, str], timeout: float
    ) -> None:
        """End a backend session this router opened at `target` and does not keep (best effort, bounded)."""
        if not session.session_id:
            return
        messenger = self._messenger(target, headers, timeout, _NOTICE_BYTES)
        with anyio.move_on_after(timeout):
            await messenger.terminate(session)

    @asynccontextmanager
    async def own_session(
        self, target: BackendTarget, headers: Mapping[str, str]
    ) -> AsyncIterator[BackendSession]:
        """A handshake session at `target` that nobody keeps: opened (`initialize`), and ended
        (DELETE, best effort, bounded) when the block ends. Raises the router's backend errors."""
        messenger = self._messenger(target, headers)
        with translated(messenger, target.timeout_seconds):
            session = await messenger.initialize()
        try:
            yield session
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(_END_WITHIN):
                await messenger.terminate(session)

    def _messenger(
        self,
        target: BackendTarget,
        headers: Mapping[str, str],
        timeout: float | None = None,
        max_response_bytes: int | None = None,
        declared: Declared = NOTHING_DECLARED,
        asker: ClientAsker | None = None,
    ) -> BackendMessenger:
        """A messenger to `target`, under its own bounds unless others are given."""
        timeout = target.timeout_seconds if timeout is None else timeout
        limit = target.max_response_bytes if max_response_bytes is None else max_response_bytes
        http, bounded = self._client(target.backend_id, headers, timeout, limit)
        return BackendMessenger(target.backend_id, target.url, http, bounded, declared, asker, timeout)


def without_meta_stamp(result: dict[str, Any]) -> dict[str, Any]:
    """A result without the backend's `serverInfo` stamp, which would misname who answered."""
    meta = result.get("_meta")
    if isinstance(meta, dict) and types.SERVER_INFO_META_KEY in meta:
        stripped = {k: v for k, v in meta.items() if k != types.SERVER_INFO_META_KEY}
        return {
            **{k: v for k, v in result.items() if k != "_meta"},
            **({"_meta": stripped} if stripped else {}),
        }
    return result
