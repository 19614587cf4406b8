"""Who a stdio server's requests of its client, and its log messages, go to: the caller whose call
the server is running.

A stdio server may ask its client for something during a call (a `tools/call`, or a read, a prompt
or a completion: listings and pings are not calls here), and log as it works. Over a pipe, neither
says which call it belongs to, so the bridge passes a request on to the caller of the one call in
flight in that process, when its session declared the capability, on that call's own stream, and
gives the server the caller's answer; a log message goes on the stream of the one call in flight,
as a server over HTTP sends a call's log messages (with no call in flight, or several, it goes to
the sessions that listen, as any other notification of the server: bridge/keeping/listeners.py).
With `isolation: per_session` a process serves one session, so its caller is always known; a
shared process running several calls at once cannot tell whose request it is, even when only one
of their callers could answer it (the request may be another's, whose caller cannot), and answers
it with an error saying so, as it does when the caller cannot answer. The bridge's client session
offers a shared server all three capabilities, since callers come and go over a process's life; the
refusals above are what that costs. A per_session server is offered its one session's own
(bridge/speaking/upstream.py), so it asks only what its client can answer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

import anyio
import mcp_types as types
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ValidationError

_Result = TypeVar("_Result", bound=BaseModel)

TELL_TIMEOUT = 1.0  # seconds a log message may wait for a caller's stream, at most


class Caller(Protocol):
    """The caller of a forwarded call, who may be asked something, or told, while it runs."""

    def answers(self, capability: str) -> bool:
        """Whether the caller declared `capability` (sampling, elicitation, roots)."""
        ...

    async def ask(self, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """Send the caller a request on its call's stream; its raw result. Raises `MCPError`."""
        ...

    async def tell(self, notification: types.LoggingMessageNotification) -> None:
        """Send the caller a log message on its call's stream (best effort)."""
        ...


class Callers:
    """The callers of one process's calls in flight, and the client-session callbacks that ask them."""

    def __init__(self, backend_id: str) -> None:
        self.backend_id = backend_id
        self._waiting: list[Caller] = []

    @contextmanager
    def waiting(self, caller: Caller | None) -> Iterator[None]:
        """`caller` may be asked, and told, while the block runs (its call is in flight)."""
        if caller is None:
            yield
            return
        self._waiting.append(caller)
        try:
            yield
        finally:
            self._waiting.remove(caller)

    async def log(self, notification: types.LoggingMessageNotification) -> bool:
        """Pass a log message on to the caller of the one call in flight; False if there is not one."""
        if len(self._waiting) != 1:
            return False
        with anyio.move_on_after(TELL_TIMEOUT):  # a caller not reading its stream loses the message
            await self._waiting[0].tell(notification)
        return True

    async def sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        kind = types.CreateMessageResultWithTools if params.tools else types.CreateMessageResult
        return await self._relay("sampling/createMessage", "sampling", params, kind)

    async def elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        return await self._relay("elicitation/create", "elicitation", params, types.ElicitResult)

    async def roots(self, context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
        return await self._relay("roots/list", "roots", None, types.ListRootsResult)

    async def _relay(
        self, method: str, capability: str, params: BaseModel | None, kind: type[_Result]
    ) -> _Result | types.ErrorData:
        # Only the caller of the one call in flight can be meant. With several, the request may be
        # that of a call whose caller cannot answer it (the server was told every caller can), so
        # asking the one that can would hand it another caller's request: refused instead.
        if len(self._waiting) > 1:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message=(
                    f"{len(self._waiting)} calls run in backend {self.backend_id}'s one process at "
                    f"once: the bridge cannot tell whose {method} this is (isolation: per_session "
                    "gives each session a process of its own)"
                ),
            )
        if not self._waiting or not self._waiting[0].answers(capability):
            return types.ErrorData(
                code=types.METHOD_NOT_FOUND,
                message=f"no caller that can answer {method} is waiting on backend {self.backend_id}",
            )
        (caller,) = self._waiting
        wire = (
            params.model_dump(by_alias=True, mode="json", exclude_none=True) if params is not None else None
        )
        try:
            return kind.model_validate(await caller.ask(method, wire))
        except MCPError as exc:
            return exc.error
        except ValidationError:
            return types.ErrorData(
                code=types.INTERNAL_ERROR, message=f"the caller answered {method} with something unusable"
            )
