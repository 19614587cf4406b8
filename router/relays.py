"""What a backend streams during a request, passed on to the client on the request's own response stream.

A client that gives its `call_tool` a progress token, or that asked for log messages (a handshake
session's `logging/setLevel`, a 2026-07-28 request's `_meta` level), gets an SSE answer (the session
layer sends such a call to the SDK's streaming handler): the router passes the token on to the
backend with the call, and each `notifications/progress` and `notifications/message` the backend
sends before its result reaches the client on the same stream, as it arrives. The backend echoes
the client's own token, so a progress report needs no translation; a log message below the
client's level (`log_floor`) is dropped here, whatever the backend sent. Other notifications the
backend sends during a call are not the call's to pass on, and are dropped here.

A backend's request of its client during the call (sampling, elicitation, roots) goes to the
client on the same stream (`ask`), written by the router beside the SDK (`ClientStream`), under an
id that names the backend and the backend's own id (`relayed_id`). The client posts its answer
with that id to whichever replica; the answer goes from there to the backend, inside the client
session's backend session (router/upstream/session_wide/backend_notices.py), where the backend
waits for it.

`NotificationRelay` is one request's relay, bound to the SDK's context of the handler answering it
and carried by its `Exchange` (router/exchange.py): `forward` takes a raw JSON-RPC message as the
backend sent it. At most `MAX_RELAYED` notifications are passed on per request, so a backend cannot
make one answer grow without bound; past that they are dropped (the result still comes).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol, get_args

import mcp_types as types
from mcp.server.context import ServerRequestContext
from pydantic import ValidationError

logger = logging.getLogger(__name__)

MAX_RELAYED = 10_000  # notifications passed on per request
Relayed = types.ProgressNotification | types.LoggingMessageNotification
_SEVERITY = {level: rank for rank, level in enumerate(get_args(types.LoggingLevel))}
_RELAYED: dict[str, type[types.ProgressNotification] | type[types.LoggingMessageNotification]] = {
    "notifications/progress": types.ProgressNotification,
    "notifications/message": types.LoggingMessageNotification,
}
_RELAYED_PREFIX = "toolsearch/relayed:"


def _at_or_above(level: object, floor: str | None) -> bool:
    """Whether a log message of `level` is one a client whose lowest level is `floor` takes."""
    if floor is None:
        return False
    return _SEVERITY.get(str(level), 0) >= _SEVERITY.get(floor, len(_SEVERITY))


def passes_level(message: Mapping[str, Any], floor: str | None) -> bool:
    """Whether a raw `notifications/message` is at or above `floor` (None: the client takes none)."""
    params = message.get("params")
    return isinstance(params, dict) and _at_or_above(params.get("level"), floor)


def relayed_id(backend_id: str, request_id: str | int) -> str:
    """The id a backend's request goes to the client with: the backend and its own id, in JSON."""
    return _RELAYED_PREFIX + json.dumps([backend_id, request_id], separators=(",", ":"))


def relayed_from(client_id: object) -> tuple[str, str | int] | None:
    """The backend and its own request id a client's answer names; None if it names none."""
    if not isinstance(client_id, str) or not client_id.startswith(_RELAYED_PREFIX):
        return None
    try:
        backend_id, request_id = json.loads(client_id[len(_RELAYED_PREFIX) :])
    except (ValueError, TypeError):
        return None
    if not isinstance(backend_id, str) or isinstance(request_id, bool):
        return None
    if not isinstance(request_id, str | int):
        return None
    return backend_id, request_id


class ClientStream(Protocol):
    """The SSE stream a request is answered on, for the messages the router writes on it itself
    beside the SDK's (router/frontdoor/streams/call_streams.py): a backend's request of the client."""

    async def send(self, message: Mapping[str, Any]) -> bool:
        """Write one JSON-RPC message as an event; False when the stream is gone (nothing was sent)."""
        ...


class NotificationRelay:
    """Passes one request's progress and log notifications from its backends to its client."""

    def __init__(
        self,
        ctx: ServerRequestContext[Any, Any],
        progress_token: str | int | None,
        log_floor: str | None = "debug",
        stream: ClientStream | None = None,
    ) -> None:
        self._ctx = ctx
        self._stream = stream  # where a backend's request of the client goes; None: nowhere
        self.progress_token = progress_token
        self.log_floor = log_floor  # the lowest level of log messages passed on; None: none
        self.relayed = 0

    async def forward(self, message: Mapping[str, Any]) -> None:
        """Pass on a backend's message if it is a progress or log notification of this request's."""
        kind = _RELAYED.get(str(message.get("method", "")))
        if kind is None or "id" in message or self.relayed >= MAX_RELAYED:
            return
        try:
            notification = kind.model_validate(message)
        except ValidationError:
            return
        if isinstance(notification, types.ProgressNotification):
            if notification.params.progress_token != self.progress_token:
                return  # not this call's: the backend named another token
        elif not _at_or_above(notification.params.level, self.log_floor):
            return  # below what the client asked for
        self.relayed += 1
        try:
            await self._ctx.session.send_notification(notification, related_request_id=self._ctx.request_id)
        except Exception as exc:  # the client went away: the call goes on, its result has nowhere to go
            logger.debug("a notification could not reach the client: %r", exc)

    @property
    def asks(self) -> bool:
        """Whether a backend's request can go to the client on this request's stream."""
        return self._stream is not None

    async def ask(self, backend_id: str, request: Mapping[str, Any]) -> bool:
        """Pass a backend's request of its client on, under `relayed_id`; False if it cannot go."""
        request_id = request.get("id")
        if self._stream is None or not isinstance(request_id, str | int) or isinstance(request_id, bool):
            return False
        return await self._stream.send({**request, "id": relayed_id(backend_id, request_id)})
