"""An upstream server as an MCP client session: what the bridge's handlers forward requests to.

`Upstream.open` opens its link (a stdio server's process, or a legacy SSE server's event stream:
bridge/transports/links.py) and runs the initialize handshake within `start_timeout`; a server that exits or
refuses first, writes only noise or never answers fails with `StartFailed`, saying which.
`forward` sends one request as it came (its raw params, less the caller's progress token: progress
is relayed through a token of our own) and waits at most the backend's call timeout, covering the
write too, since a server that stops reading its stdin would otherwise hold the request forever.
Its failures are `MCPError`s whose message names the backend; the server's own errors pass as they
are. The server's notifications go to `on_notification`, which must not block; its requests of its
client, and its log messages during a call, go to the caller of that call (bridge/speaking/callers.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.client.session import ClientSession, IncomingMessage
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, ValidationError

from bridge.speaking.callers import Caller, Callers
from bridge.transports.links import Link, Opener, StartFailed
from toolsearch.outgoing import VERSION

logger = logging.getLogger(__name__)

CLIENT_INFO = types.Implementation(name="toolsearch-bridge", version=VERSION)
WRITE_MARGIN = 1.0  # seconds beyond the call timeout before a request stuck in the write is given up
DESCRIBE_WAIT = 0.5  # seconds to wait for an ending process's exit status, to name it in a message
# keys of a request's _meta that belong to the caller's own connection, not to the forwarded request
_CONNECTION_META = ("progressToken", "io.modelcontextprotocol/")

Notify = Callable[[types.ServerNotification], None]


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    """What every upstream server of one backend is held to."""

    start_timeout: float  # seconds to start and answer initialize
    call_timeout: float  # seconds for any other request
    max_line_bytes: int  # the largest message it may send


class Unavailable(MCPError):
    """A backend's server is not running (or no longer); the message says why, `status` how a request
    opening a session is answered (503, or the status a legacy server refused its stream with)."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(types.INTERNAL_ERROR, message)
        self.status = status


class RawResult(BaseModel):
    """A result taken as it came; the SDK has checked it against the protocol version already."""

    model_config = ConfigDict(extra="allow")


class Forwarded(types.Request[dict[str, Any] | None, str]):
    """A request passed on as it came: its method and its params, untouched by any model."""


def _outbound(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if params is None:
        return None
    out = dict(params)
    meta = out.pop("_meta", None)
    if isinstance(meta, Mapping):
        kept = {k: v for k, v in meta.items() if not str(k).startswith(_CONNECTION_META)}
        if kept:
            out["_meta"] = kept
    return out


def _callbacks(callers: Callers, offered: types.ClientCapabilities | None) -> dict[str, Any]:
    """The client session's callbacks for what its server may ask: those `offered` (each callback
    given is a capability the SDK declares at initialize), all three when None."""
    callbacks: dict[str, Any] = {}
    if offered is None or offered.sampling is not None:
        callbacks["sampling_callback"] = callers.sampling
    if offered is None or offered.elicitation is not None:
        callbacks["elicitation_callback"] = callers.elicitation
    if offered is None or offered.roots is not None:
        callbacks["list_roots_callback"] = callers.roots
    return callbacks


class Upstream:
    """One initialized upstream server: its link (process or connection), its session, what it said it is."""

    def __init__(
        self,
        opener: Opener,
        link: Link,
        session: ClientSession,
        init: types.InitializeResult,
        timeout: float,
        callers: Callers,
    ) -> None:
        self.opener = opener
        self.link = link
        self.init = init
        self._session = session
        self.timeout = timeout  # seconds for each request
        # whom its requests of the client and its logs go to (bridge/speaking/callers.py)
        self._callers = callers

    @property
    def backend_id(self) -> str:
        return self.opener.backend_id

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        opener: Opener,
        settings: UpstreamSettings,
        on_notification: Notify,
        headers: Mapping[str, str] | None = None,
        offered: types.ClientCapabilities | None = None,
    ) -> AsyncIterator[Upstream]:
        """Open and initialize; `headers`: what the server must get of the bridge session's opening
        request (a legacy server's auth header); `offered`: the capabilities of the one session the
        server is to serve, which it is offered as its client's (all three when None: a shared
        server's callers come and go)."""
        callers = Callers(opener.backend_id)

        async def handle(message: IncomingMessage) -> None:
            if isinstance(message, types.LoggingMessageNotification) and await callers.log(message):
                return  # a log message of the one call in flight: on that call's stream
            if isinstance(message, types.ServerNotification) and not isinstance(
                message, types.ProgressNotification
            ):
                on_notification(message)  # progress of our own requests is relayed per request

        # Raised once the process is stopped: from inside, the task groups would wrap it in a group.
        failure: StartFailed | None = None
        async with opener.open(settings.max_line_bytes, headers or {}) as (link, reads, writes):
            session = ClientSession(
                reads,
                writes,
                client_info=CLIENT_INFO,
                message_handler=handle,
                **_callbacks(callers, offered),
            )
            async with session:
                try:
                    init = await _initialize(link, session, settings.start_timeout)
                except StartFailed as exc:
                    failure = exc
                else:
                    yield cls(opener, link, session, init, settings.call_timeout, callers)
        if failure is not None:
            raise failure

    async def forward(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
    ) -> dict[str, Any]:
        """Send one request to the server and return its raw result; raises `MCPError`. What the
        server asks of its client meanwhile, and logs, goes to `caller` (bridge/speaking/callers.py)."""
        request = Forwarded(method=method, params=_outbound(params))
        try:
            with anyio.fail_after(self.timeout + WRITE_MARGIN), self._callers.waiting(caller):
                result = await self._session.send_request(
                    request,
                    RawResult,
                    request_read_timeout_seconds=self.timeout,
                    progress_callback=progress,
                )
        except TimeoutError:
            raise self._timed_out(method) from None
        except MCPError as exc:
            if exc.code == types.REQUEST_TIMEOUT:
                raise self._timed_out(method) from None
            if exc.code == types.CONNECTION_CLOSED:
                await self.link.settle(DESCRIBE_WAIT)
                reason = self.link.exit_reason() or "closed the connection"
                raise MCPError(
                    types.INTERNAL_ERROR,
                    f"backend {self.backend_id}: the {self.opener.what} {reason} while answering {method}",
                ) from None
            raise
        except ValidationError:
            raise MCPError(
                types.INTERNAL_ERROR,
                f"backend {self.backend_id}: the {self.opener.what} answered {method} with a result that "
                "does not fit the protocol",
            ) from None
        return dict(result.model_extra or {})

    def _timed_out(self, method: str) -> MCPError:
        return MCPError(
            types.REQUEST_TIMEOUT,
            f"backend {self.backend_id}: the {self.opener.what} did not answer {method} "
            f"within {self.timeout:g}s",
        )


async def _initialize(link: Link, session: ClientSession, timeout: float) -> types.InitializeResult:
    """The handshake within `timeout`, or `StartFailed` saying what the server did instead."""
    try:
        with anyio.fail_after(timeout):
            return await session.initialize()
    except TimeoutError:
        raise StartFailed(f"did not answer initialize within {timeout:g}s{link.noise_note()}") from None
    except MCPError as exc:
        await link.settle(DESCRIBE_WAIT)
        if reason := link.exit_reason():
            raise StartFailed(f"{reason} before answering initialize{link.noise_note()}") from None
        raise StartFailed(f"refused initialize: {exc.error.message}") from None
    except (RuntimeError, ValidationError) as exc:
        raise StartFailed(f"answered initialize with something unusable ({exc})"[:300]) from None
