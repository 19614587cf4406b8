"""A stdio server spoken to in protocol 2026-07-28: every caller's request passed on as it came.

A backend configured with `protocol: 2026-07-28` keeps no session with the bridge: each request
carries its own envelope in `_meta` (protocol version, client info, what the client can answer), and
the server answers what it needs of the client with an input-required result whose request state
the client sends back. So the bridge does no MCP work for it: `exchange` writes the caller's request
to the pipe as it came, under an id of the bridge's own (callers on many connections share one
pipe), and returns the server's answer as it came, under the caller's id. Nothing is checked
against a schema: results of any shape, input-required ones, and errors pass through untouched.

Notifications find their request by what they carry: progress by its token (the caller's token is
sent as one of the bridge's own, since two callers may choose the same), a listen's changes by
their `io.modelcontextprotocol/subscriptionId` (the listen's id on the pipe). A log message names no
request; it goes to the one call in flight when there is one and is dropped otherwise, as with a
handshake-era server (bridge/speaking/callers.py). A caller that leaves, or a request that outlives the
backend's timeout, is cancelled at the server (`notifications/cancelled`); a listen has no timeout,
it lasts until its caller leaves, and at most `max_listens` run at once.

`ModernUpstream.open` starts the process and asks it `server/discover` within `start_timeout`: a
server that refuses it (one that speaks only the initialize handshake) fails to start, saying to
configure it as `protocol: 2025-11-25`.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types.version import LATEST_MODERN_VERSION

from bridge.speaking.forwarding import WORKING
from bridge.speaking.upstream import CLIENT_INFO, DESCRIBE_WAIT, WRITE_MARGIN, Unavailable, UpstreamSettings
from bridge.transports.links import Link, Opener, Reads, StartFailed, Writes

LISTEN = "subscriptions/listen"
CANCEL_WAIT = 1.0  # seconds to tell the server a request was cancelled, at most

# takes one notification for the caller of one request, as it is sent to that caller; must not
# block (the pipe's reader calls it)
Deliver = Callable[[dict[str, Any]], None]


@dataclass(slots=True)
class _Pending:
    """One caller's request on the pipe, until its answer comes."""

    caller_id: types.RequestId
    method: str
    deliver: Deliver | None
    token: types.ProgressToken | None  # the caller's progress token, sent as the pipe id
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: dict[str, Any] | None = None


def _envelope(method: str) -> dict[str, Any]:
    """The bridge's own 2026-07-28 request (its start check), stamped as that protocol has it."""
    meta = {
        types.PROTOCOL_VERSION_META_KEY: LATEST_MODERN_VERSION,
        types.CLIENT_INFO_META_KEY: CLIENT_INFO.model_dump(mode="json", exclude_none=True),
        types.CLIENT_CAPABILITIES_META_KEY: {},
    }
    return {"jsonrpc": "2.0", "id": "discover", "method": method, "params": {"_meta": meta}}


class ModernUpstream:
    """One 2026-07-28 stdio server, its pipe shared by every caller's requests."""

    def __init__(self, opener: Opener, link: Link, writes: Writes, settings: UpstreamSettings) -> None:
        self.opener = opener
        self.link = link
        self.timeout = settings.call_timeout
        self.discovered: dict[str, Any] = {}  # the server's answer to server/discover
        self._writes = writes
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._gone = ""  # why the pipe closed, once it has

    @property
    def backend_id(self) -> str:
        return self.opener.backend_id

    def listens(self) -> int:
        """How many listens are open on the pipe."""
        return sum(1 for p in self._pending.values() if p.method == LISTEN)

    @classmethod
    @asynccontextmanager
    async def open(cls, opener: Opener, settings: UpstreamSettings) -> AsyncIterator[ModernUpstream]:
        """Start the server and check it speaks 2026-07-28; raises `StartFailed` saying why not."""
        failure: StartFailed | None = None  # raised once the process is stopped (not as a group)
        async with opener.open(settings.max_line_bytes, {}) as (link, reads, writes):
            upstream = cls(opener, link, writes, settings)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(upstream._read, reads)
                try:
                    upstream.discovered = await upstream._discover(settings.start_timeout)
                except StartFailed as exc:
                    failure = exc
                else:
                    yield upstream
                tasks.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def _discover(self, timeout: float) -> dict[str, Any]:
        with anyio.move_on_after(timeout):
            answer = await self.exchange(_envelope("server/discover"), None)
            if "error" in answer:
                message = answer["error"].get("message", "")
                raise StartFailed(
                    f"refused server/discover ({message}): a server that speaks the initialize handshake "
                    "is configured with protocol: 2025-11-25"
                )
            versions = answer.get("result", {}).get("supportedVersions", [])
            if LATEST_MODERN_VERSION not in versions:
                raise StartFailed(f"does not speak protocol {LATEST_MODERN_VERSION} (it supports {versions})")
            return dict(answer["result"])
        await self.link.settle(DESCRIBE_WAIT)
        reason = self.link.exit_reason()
        raise StartFailed(
            f"{reason} before answering server/discover{self.link.noise_note()}"
            if reason
            else f"did not answer server/discover within {timeout:g}s{self.link.noise_note()}"
        )

    async def exchange(self, request: Mapping[str, Any], deliver: Deliver | None) -> dict[str, Any]:
        """The server's answer to one JSON-RPC request, under the request's own id; its notifications
        go to `deliver` (none: dropped). A failure of the bridge's is an answer too (a JSON-RPC error)."""
        if self._gone:
            raise Unavailable(f"backend {self.backend_id}: the {self.opener.what} {self._gone}")
        pipe_id = next(self._ids)
        method = str(request["method"])
        params = dict(request.get("params") or {})
        meta = dict(params.get("_meta") or {})
        token = meta.get("progressToken")
        if token is not None:
            meta["progressToken"] = pipe_id
            params["_meta"] = meta
        pending = _Pending(request["id"], method, deliver, token)
        self._pending[pipe_id] = pending
        out = types.JSONRPCRequest(jsonrpc="2.0", id=pipe_id, method=method, params=params or None)
        # a listen lasts as long as its caller stays; anything else is held to the backend's timeout
        limit = None if method == LISTEN else self.timeout + WRITE_MARGIN
        try:
            with anyio.move_on_after(limit):
                # a closed pipe: its reader answers every request waiting, this one too, saying why
                with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await self._writes.send(SessionMessage(out))
                await pending.answered.wait()
        finally:
            del self._pending[pipe_id]
            if pending.answer is None and not self._gone:
                with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WAIT):
                    await self._cancel(pipe_id)
        if pending.answer is not None:
            return {**pending.answer, "id": pending.caller_id}
        what = f"the {self.opener.what}"
        message = (
            f"backend {self.backend_id}: {what} {self._gone} while answering {method}"
            if self._gone
            else f"backend {self.backend_id}: {what} did not answer {method} within {self.timeout:g}s"
        )
        code = types.INTERNAL_ERROR if self._gone else types.REQUEST_TIMEOUT
        return {"jsonrpc": "2.0", "id": pending.caller_id, "error": {"code": code, "message": message}}

    async def _cancel(self, pipe_id: int) -> None:
        params = {"requestId": pipe_id, "reason": "the caller left or the request timed out"}
        cancelled = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/cancelled", params=params)
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._writes.send(SessionMessage(cancelled))

    async def _read(self, reads: Reads) -> None:
        async with reads:
            async for item in reads:
                if not isinstance(item, SessionMessage):
                    continue  # the link logs what it could not read
                message = item.message
                if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
                    self._answer(message)
                elif isinstance(message, types.JSONRPCNotification):
                    self._notify(message)
                elif isinstance(message, types.JSONRPCRequest):
                    await self._refuse(message)
        await self.link.settle(DESCRIBE_WAIT)
        self._gone = self.link.exit_reason() or "closed its stdout"
        for pending in self._pending.values():
            pending.answered.set()  # unanswered: `exchange` says the server is gone

    def _answer(self, message: types.JSONRPCResponse | types.JSONRPCError) -> None:
        pending = self._pending.get(message.id) if isinstance(message.id, int) else None
        if pending is not None:
            pending.answer = message.model_dump(by_alias=True, mode="json", exclude_unset=True)
            pending.answered.set()

    def _notify(self, message: types.JSONRPCNotification) -> None:
        params = dict(message.params or {})
        meta = params.get("_meta")
        pending: _Pending | None = None
        if message.method == "notifications/progress" and isinstance(params.get("progressToken"), int):
            pending = self._pending.get(params["progressToken"])
            if pending is not None:
                params["progressToken"] = pending.token
        elif isinstance(meta, dict) and isinstance(listen_id := meta.get(SUBSCRIPTION_ID_META_KEY), int):
            pending = self._pending.get(listen_id)
            if pending is not None:
                params["_meta"] = {**meta, SUBSCRIPTION_ID_META_KEY: pending.caller_id}
        elif message.method == "notifications/message":
            working = [p for p in self._pending.values() if p.method in WORKING]
            pending = working[0] if len(working) == 1 else None
        if pending is not None and pending.deliver is not None:
            pending.deliver({"jsonrpc": "2.0", "method": message.method, "params": params})

    async def _refuse(self, request: types.JSONRPCRequest) -> None:
        # 2026-07-28 has no requests of the client: what a server needs, it asks in its results
        error = types.ErrorData(
            code=types.METHOD_NOT_FOUND,
            message=f"{request.method}: protocol 2026-07-28 has no requests of the client (return an "
            "input-required result instead)",
        )
        answer = types.JSONRPCError(jsonrpc="2.0", id=request.id, error=error)
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._writes.send(SessionMessage(answer))
