"""A backend's result reaches the client as the backend sent it: every field, known or not.

The SDK's server shapes each handler result for the wire: it validates it against the negotiated
version's schema and keeps only the fields that schema names, so a content type or a field newer
than the SDK would be dropped, or the whole result refused. A gateway must not re-judge what a
backend answered, so a handler marks a backend's result (`PassedThrough`), and two parts carry it
around that shaping:

- `holding(handler)` wraps a handler: a marked result is set aside for the request, and the SDK
  shapes a stand-in of the same kind instead (an empty one, which always validates);
- `PassThroughMiddleware`, a server middleware, answers with the result set aside, in the envelope
  the SDK gave the stand-in: `resultType` and the caching hints where the client's protocol has
  them (and a backend's `resultType` to a 2026-07-28 client, which may say `input_required`), and
  the router's own `serverInfo` stamp in `_meta` beside the backend's other `_meta` keys.

A result of another era's client loses only that envelope: a 2025-11-25 client never sees
`resultType`, `ttlMs` or `cacheScope`, which its schema does not have. Everything else, content
of every type, `structuredContent`, `_meta` and unknown fields, is passed on untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types import SERVER_INFO_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

# the stand-in the SDK shapes instead of a passed-through result, by method
_STAND_INS: dict[str, dict[str, Any]] = {
    "tools/call": {"content": []},
    "resources/read": {"contents": []},
    "prompts/get": {"messages": []},
}
_ENVELOPE = ("resultType", "ttlMs", "cacheScope")  # 2026-07-28 fields the router sets for its client


class PassedThrough(dict[str, Any]):
    """A backend's result, to be answered as it is (a plain dict to everything that reads it)."""


class _Held:
    def __init__(self) -> None:
        self.result: PassedThrough | None = None


_held: ContextVar[_Held | None] = ContextVar("toolsearch_passed_through", default=None)
Handler = Callable[[ServerRequestContext[Any, Any], Any], Awaitable[Any]]


def holding(handler: Handler) -> Handler:
    """`handler`, whose `PassedThrough` results are set aside for `PassThroughMiddleware`."""

    async def held(ctx: ServerRequestContext[Any, Any], params: Any) -> Any:
        result = await handler(ctx, params)
        holder = _held.get()
        if isinstance(result, PassedThrough) and holder is not None and ctx.method in _STAND_INS:
            holder.result = result
            modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
            return {**_STAND_INS[ctx.method], **({"resultType": "complete"} if modern else {})}
        return result

    return held


def _meta(backend: Any, shaped: Any) -> dict[str, Any]:
    """The backend's `_meta` without its `serverInfo` stamp, with the router's (2026-07-28) instead."""
    kept = (
        {k: v for k, v in backend.items() if k != SERVER_INFO_META_KEY} if isinstance(backend, dict) else {}
    )
    return {**kept, **(shaped if isinstance(shaped, dict) else {})}


def answer(result: PassedThrough, shaped: dict[str, Any], protocol_version: str | None) -> dict[str, Any]:
    """`result` in the envelope the SDK gave the stand-in (`shaped`) for a client of `protocol_version`."""
    answered = {k: v for k, v in result.items() if k not in _ENVELOPE and k != "_meta"}
    answered.update({k: shaped[k] for k in _ENVELOPE if k in shaped})
    if protocol_version in MODERN_PROTOCOL_VERSIONS and isinstance(result.get("resultType"), str):
        answered["resultType"] = result["resultType"]
    if meta := _meta(result.get("_meta"), shaped.get("_meta")):
        answered["_meta"] = meta
    return answered


class PassThroughMiddleware:
    """Answers a request whose handler passed a backend's result through with that result."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method not in _STAND_INS:
            return await call_next(ctx)
        holder = _Held()
        token = _held.set(holder)
        try:
            shaped = await call_next(ctx)
        finally:
            _held.reset(token)
        if holder.result is None or not isinstance(shaped, dict):
            return shaped
        return answer(holder.result, shaped, ctx.protocol_version)
