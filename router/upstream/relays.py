"""What a backend streams during a call, passed on to the client on the call's own response stream.

A client that gives its `call_tool` a progress token, or that asked for log messages (a handshake
session's `logging/setLevel`, a 2026-07-28 request's `_meta` level), gets an SSE answer (the session
layer sends such a call to the SDK's streaming handler): the router passes the token on to the
backend with the call, and each `notifications/progress` and `notifications/message` the backend
sends before its result reaches the client on the same stream, as it arrives. The backend echoes
the client's own token, so a progress report needs no translation; a log message below the
client's level (`log_floor`) is dropped here, whatever the backend sent. Anything else the backend
sends during a call (its requests, other notifications) is not the call's to pass on, and is
dropped here.

`NotificationRelay` is one call's relay: `forward` takes a raw JSON-RPC message (a kept backend
session's stream), `progress` and `log` are the SDK client's callbacks (2026-07-28 and SSE
backends). At most `MAX_RELAYED` notifications are passed on per call, so a backend cannot make
one call's answer grow without bound; past that they are dropped (the result still comes).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, get_args

import mcp_types as types
from mcp.server.context import ServerRequestContext
from pydantic import ValidationError

logger = logging.getLogger(__name__)

MAX_RELAYED = 10_000  # notifications passed on per call
Relayed = types.ProgressNotification | types.LoggingMessageNotification
_SEVERITY = {level: rank for rank, level in enumerate(get_args(types.LoggingLevel))}
_RELAYED: dict[str, type[types.ProgressNotification] | type[types.LoggingMessageNotification]] = {
    "notifications/progress": types.ProgressNotification,
    "notifications/message": types.LoggingMessageNotification,
}


class NotificationRelay:
    """Passes one call's progress and log notifications from its backend to its client."""

    def __init__(
        self,
        ctx: ServerRequestContext[Any, Any],
        progress_token: str | int | None,
        log_floor: str | None = "debug",
    ) -> None:
        self._ctx = ctx
        self.progress_token = progress_token
        self.log_floor = log_floor  # the lowest level of log messages passed on; None: none
        self._floor = _SEVERITY.get(log_floor, len(_SEVERITY)) if log_floor is not None else len(_SEVERITY)
        self.relayed = 0

    async def _send(self, notification: Relayed) -> None:
        if self.relayed >= MAX_RELAYED:
            return
        if (
            isinstance(notification, types.LoggingMessageNotification)
            and _SEVERITY.get(notification.params.level, 0) < self._floor
        ):
            return  # below what the client asked for
        self.relayed += 1
        try:
            await self._ctx.session.send_notification(notification, related_request_id=self._ctx.request_id)
        except Exception as exc:  # the client went away: the call goes on, its result has nowhere to go
            logger.debug("a notification could not reach the client: %r", exc)

    async def forward(self, message: Mapping[str, Any]) -> None:
        """Pass on a backend's message if it is a progress or log notification."""
        kind = _RELAYED.get(str(message.get("method", "")))
        if kind is None or "id" in message:
            return
        try:
            notification = kind.model_validate(message)
        except ValidationError:
            return
        if (
            isinstance(notification, types.ProgressNotification)
            and notification.params.progress_token != self.progress_token
        ):
            return  # not this call's: the backend named another token
        await self._send(notification)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """The SDK client's progress callback."""
        if self.progress_token is None:
            return
        params = types.ProgressNotificationParams(
            progress_token=self.progress_token, progress=progress, total=total, message=message
        )
        await self._send(types.ProgressNotification(params=params))

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        """The SDK client's logging callback."""
        await self._send(types.LoggingMessageNotification(params=params))
