"""The way to a backend: tools called and requests sent over MCP (Streamable HTTP), for one client
request (`Exchange`, router/exchange.py), with pooled connections and a deadline per request.

A request takes its backend as one `BackendTarget` (toolsearch/targets.py), read from the indexer's
answer by the link with the defaults applied: where it is, its auth, its timeout and size bound, its
protocol, and the client session's backend session there. What it needs besides comes in its
exchange: who asks (the credentials it carries: router/upstream/calls/credentials.py), in which
client session (the backend session it runs in: router/upstream/calls/session_keeping.py), what
the client declared, where what the backend streams goes, how the client is asked across the eras.

Each backend has its own connection pool (router/upstream/wire/pools.py) for as long as the
application runs; each request wraps its backend's pool in a lightweight `httpx2.AsyncClient`
carrying its headers and timeout, through a `BoundedTransport` (toolsearch/responses.py) that cuts
the answer at the backend's `max_response_bytes` while it is read. The per-request client is never
closed: the pool is the application's.

A handshake-era backend is called inside the client session's backend session
(router/upstream/wire/backend_messages.py): opened at the session's first request to it, kept in the
indexer, reused by every replica, ended by the indexer when the client session ends. A backend that
spoke 2026-07-28 at discovery is called with one stamped request of the router's own
(router/upstream/wire/modern.py); a legacy SSE backend is a handshake-era one at the bridge, which
holds its sessions. Which of those ways a request takes is router/upstream/calls/eras.py's choice.
Every result comes back as the backend sent it (router/handlers/passthrough.py carries it to the
client): only its being a JSON object is checked, and a note added when its backend session was
replaced or not kept (router/upstream/calls/session_notes.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NamedTuple

import anyio
import httpx2
import mcp_types as types

from router.caller import Caller
from router.errors import BackendError, BackendRejected, BackendSessionGone, CallCancelled, RouterError
from router.exchange import BARE, Exchange
from router.link.indexer_client import IndexerClient
from router.upstream.calls.credentials import OutgoingCredentials
from router.upstream.calls.eras import Eras, translated
from router.upstream.calls.running_calls import RunningCalls
from router.upstream.calls.session_keeping import SessionKeeper
from router.upstream.calls.session_notes import SessionNote, noted_call, noted_result
from router.upstream.wire.backend_messages import BackendMessenger
from router.upstream.wire.pools import BackendPools
from toolsearch.responses import BoundedTransport
from toolsearch.sessions import BackendSession
from toolsearch.targets import BackendTarget

logger = logging.getLogger(__name__)

_NOTICE_BYTES = 65_536  # the most an answer to a notification or a DELETE may weigh
_END_WITHIN = 2.0  # seconds an unkept session's DELETE may take


class RequestOutcome(NamedTuple):
    """A request's result as the wire has it (noted when its backend session was replaced or not
    kept), and the backend session it ran in (None: none kept)."""

    result: dict[str, Any]
    session: BackendSession | None


@dataclass(frozen=True, slots=True)
class OwnSession:
    """A handshake session at a backend that nobody keeps (a listen's): its requests go in it alone."""

    target: BackendTarget  # in the session
    session: BackendSession
    messenger: BackendMessenger

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """One request in the session; raises the router's backend errors."""
        with translated(self.messenger, self.target.timeout_seconds):
            return await self.messenger.request(method, params, self.session)


class BackendCaller:
    """Calls backend MCP servers for clients' requests, each through its own backend's connection pool.

    It carries each request's credentials (`credentials`), keeps the backend sessions requests open
    with their client sessions, and holds the calls running in this process (`running`), so that a
    client's cancellation ends its call here at once.
    """

    def __init__(self, pools: BackendPools, indexer: IndexerClient, secrets: Mapping[str, str]) -> None:
        self._pools = pools
        self._indexer = indexer
        self.credentials = OutgoingCredentials(indexer, secrets)
        self.running = RunningCalls()
        self._eras = Eras()  # which era each request goes in

    def refuses_sessions(self, target: BackendTarget) -> bool:
        """Whether a backend speaks 2026-07-28 only: it refused the handshake (so subscriptions too)."""
        return self._eras.refuses_sessions(target)

    def stream_client(self, target: BackendTarget, headers: Mapping[str, str]) -> httpx2.AsyncClient:
        """A client for a long-lived stream from `target` (a backend session's standalone stream):
        its backend's pool of streams, its timeout to connect and to answer, none between two
        events. Never closed: the pool is the application's."""
        timeout = httpx2.Timeout(target.timeout_seconds, read=None)
        transport = self._pools.for_streams(target.backend_id)
        return httpx2.AsyncClient(transport=transport, headers=dict(headers), timeout=timeout)

    async def call_tool(
        self, target: BackendTarget, name: str, arguments: Mapping[str, Any], exchange: Exchange
    ) -> dict[str, Any]:
        """Run `name` on the backend `target` names; its result as it came.

        A handshake-era Streamable HTTP backend is called inside `target.session`, the client
        session's backend session (one POST); without one, or when the backend forgot it (404,
        once), a new one is opened and kept first. A 2026-07-28 backend gets one request, without a
        kept session. A caller whose session others share keeps none: each call opens its own. With
        the exchange's relay, the backend gets the client's progress token, and its progress and
        log notifications go to the client as they arrive. The exchange's retry (what a 2026-07-28
        client's retry of an input-required call carries back, `inputResponses` and
        `requestState`) goes to the backend as it came. A token_exchange backend that refuses the
        token kept for this caller (401) gets a fresh one, once.

        Raises `BackendTimeout` after the target's `timeout_seconds`, `BackendRejected` on HTTP
        401/403, `BackendTooLarge` for an answer over its `max_response_bytes`, `CallCancelled`
        when the client cancelled it, and `BackendUnavailable` or `BackendError` for anything else
        that keeps a result from coming back.
        """
        wire: dict[str, Any] = {**exchange.retry, "name": name, "arguments": dict(arguments)}
        relay = exchange.relay
        if relay is not None and relay.progress_token is not None:
            wire["_meta"] = {"progressToken": relay.progress_token}
        try:
            return await self._call(target, wire, exchange)
        except BackendRejected as exc:
            if exc.status != 401 or target.auth.type != "token_exchange":
                raise
            # The token kept for this caller was refused (revoked, or signed with a retired key):
            # refused, the call did not run; one fresh exchange, and one more try.
            return await self._call(target, wire, exchange, renew=True)

    async def _call(
        self, target: BackendTarget, wire: Mapping[str, Any], exchange: Exchange, renew: bool = False
    ) -> dict[str, Any]:
        """One try of a call; a client's cancellation ends it here."""
        caller = exchange.caller
        headers = await self.credentials.headers(target, caller.identity, renew)
        with self.running.running(caller.session_id, exchange.call_id) as running:
            result, _, note = await self._sent(target, "tools/call", wire, exchange, headers)
        if running.cancelled:
            raise CallCancelled(target.backend_id, running.reason)
        return noted_call(result, note)

    async def request(
        self, target: BackendTarget, method: str, params: Mapping[str, Any], exchange: Exchange
    ) -> RequestOutcome:
        """Send one request other than tools/call (a listing, a read, a prompt, a completion).

        The same ways to the backend as `call_tool`, and the same errors: inside the client
        session's backend session for a handshake-era backend (a new one opened and kept when there
        is none or it was forgotten), in a request of its own for a 2026-07-28 backend (but see
        router/upstream/calls/eras.py). With the exchange's relay (a streamed answer), what the
        backend sends before its result goes to the client as during a call: its progress, its log
        messages, its requests of the client; with its asker, a 2026-07-28 client's as input rounds.
        """
        headers = await self.credentials.headers(target, exchange.caller.identity)
        result, session, note = await self._sent(target, method, params, exchange, headers)
        return RequestOutcome(noted_result(result, note), session)

    async def _sent(
        self,
        target: BackendTarget,
        method: str,
        params: Mapping[str, Any],
        exchange: Exchange,
        headers: Mapping[str, str],
    ) -> tuple[dict[str, Any], BackendSession | None, SessionNote | None]:
        """One request in the backend session its keeper keeps: its result without the backend's
        stamp, the session it ran in, and what its result is to say of that session."""
        if exchange.caller.shared:  # a shared implied session keeps none: each request opens its own
            target = replace(target, session=None)
        messenger = self._messenger(target, headers, exchange)
        end = partial(self._end_session, target, headers)
        keeper = SessionKeeper(self._indexer, exchange.caller, target, end)
        try:
            answer, session, replaced = await self._eras.send(messenger, target, method, params, keeper)
        finally:
            await keeper.close()
        return without_meta_stamp(answer), session, keeper.note(replaced)

    async def notify(
        self, target: BackendTarget, method: str, params: Mapping[str, Any], caller: Caller, within: float
    ) -> None:
        """Send a client's notification inside the target's session, best effort, within `within`
        seconds; a target without a session has nothing of the client's to be told."""
        messenger = await self._noticing(target, caller, within, method)
        if messenger is not None and target.session is not None:
            with anyio.move_on_after(within):
                try:
                    await messenger.notify(method, params, target.session)
                except (BackendError, httpx2.HTTPError) as exc:
                    logger.debug("backend %s: passing on %s failed: %s", target.backend_id, method, exc)

    async def set_level(self, target: BackendTarget, level: str, caller: Caller, within: float) -> None:
        """Pass a client's log level on to the target's session, best effort, within `within` seconds."""
        messenger = await self._noticing(target, caller, within, "a log level")
        if messenger is not None and target.session is not None:
            with anyio.move_on_after(within):
                try:
                    await messenger.set_level(level, target.session)
                except (BackendError, httpx2.HTTPError) as exc:
                    logger.debug("backend %s: passing on a log level failed: %s", target.backend_id, exc)

    async def _noticing(
        self, target: BackendTarget, caller: Caller, within: float, what: str
    ) -> BackendMessenger | None:
        """A messenger for a best-effort notice to the target's session; None when there is no
        session, or no credentials for it (logged at debug)."""
        if target.session is None:
            return None
        try:
            headers = await self.credentials.headers(target, caller.identity)
        except RouterError as exc:
            logger.debug("backend %s: %s was not passed on: %s", target.backend_id, what, exc)
            return None
        return self._messenger(target, headers, BARE, within)

    async def respond(
        self, target: BackendTarget, answer: Mapping[str, Any], caller: Caller, within: float
    ) -> None:
        """Post a client's answer to a backend's request inside the target's session, within
        `within` seconds; raises the router's errors (`BackendTimeout` when it takes longer)."""
        if target.session is None:
            raise BackendSessionGone(target.backend_id, "keeps no session of this client")
        headers = await self.credentials.headers(target, caller.identity)
        messenger = self._messenger(target, headers, BARE, within)
        with translated(messenger, within):
            await messenger.respond(answer, target.session)

    async def _end_session(
        self, target: BackendTarget, headers: Mapping[str, str], session: BackendSession
    ) -> None:
        """End a backend session this router opened at `target` and does not keep (best effort, bounded)."""
        if not session.session_id:
            return
        within = min(target.timeout_seconds, _END_WITHIN)
        messenger = self._messenger(target, headers, BARE, within)
        with anyio.move_on_after(within):
            await messenger.terminate(session)

    @asynccontextmanager
    async def own_session(
        self, target: BackendTarget, headers: Mapping[str, str]
    ) -> AsyncIterator[OwnSession]:
        """A handshake session at `target` that nobody keeps: opened (`initialize`), and ended
        (DELETE, best effort, bounded) when the block ends. Raises the router's backend errors."""
        messenger = self._messenger(target, headers, BARE)
        with translated(messenger, target.timeout_seconds):
            session = await messenger.initialize()
        try:
            yield OwnSession(replace(target, session=session), session, messenger)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(_END_WITHIN):
                await messenger.terminate(session)

    def _messenger(
        self,
        target: BackendTarget,
        headers: Mapping[str, str],
        exchange: Exchange,
        timeout: float | None = None,
    ) -> BackendMessenger:
        """A messenger to `target` for `exchange`, under the target's bounds, or a notice's (`timeout`)."""
        bound = target if timeout is None else replace(target, timeout_seconds=timeout)
        limit = target.max_response_bytes if timeout is None else _NOTICE_BYTES
        bounded = BoundedTransport(self._pools.for_backend(target.backend_id), limit)
        http = httpx2.AsyncClient(
            transport=bounded, headers=dict(headers), timeout=httpx2.Timeout(bound.timeout_seconds)
        )
        return BackendMessenger(bound, http, bounded, exchange)


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
