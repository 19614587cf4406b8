"""What the bridge holds under each upstream MCP session, whichever transport the server speaks.

A stdio server's session is its process (bridge/transports/process.py: `Launch`, `ServerProcess`); a legacy
HTTP+SSE server's is its open event stream (bridge/transports/legacy.py: `Dial`, `LegacyConnection`). Both
give the bridge the same two things: an `Opener`, which opens one session's `Link` and the pair of
message streams a `ClientSession` runs on, and the `Link`, which says whether and how it ended.
The rest of the bridge (bridge/speaking/upstream.py, the supervisor, the pool) works on these alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

# the streams a ClientSession reads from and writes to
Reads = MemoryObjectReceiveStream[SessionMessage | Exception]
Writes = MemoryObjectSendStream[SessionMessage]


class StartFailed(RuntimeError):
    """A server that could not be reached or started, or did not become an MCP server; says why.

    `status` is the HTTP status a legacy server refused the connection with (401, 403...), if any:
    the caller gets the same.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Link(Protocol):
    """One upstream session's carrier: a process, or a connection."""

    @property
    def pid(self) -> int | None: ...  # the process id; None for a connection

    @property
    def ended(self) -> anyio.Event: ...  # set once no message can pass any more

    def exit_reason(self) -> str:
        """How it ended, in words ("exited with code 1", "closed its event stream"); empty while open."""
        ...

    def noise_note(self) -> str:
        """What it sent that was not a message, for a start failure; empty if nothing."""
        ...

    async def settle(self, timeout: float) -> None:
        """Wait up to `timeout` for an ending link to say how it ended."""
        ...


class Opener(Protocol):
    """How to open one upstream session of a backend."""

    @property
    def backend_id(self) -> str: ...

    @property
    def what(self) -> str: ...  # how messages name one session's server: "stdio server", ...

    @property
    def many(self) -> str: ...  # and several of them: "stdio server processes", ...

    def describe(self) -> str:
        """What is started or reached, for log lines (never a secret)."""
        ...

    def open(
        self, max_message_bytes: int, headers: Mapping[str, str]
    ) -> AbstractAsyncContextManager[tuple[Link, Reads, Writes]]:
        """Open a session (`headers`: what the bridge session's opening request carried that the server
        must get too); leaving the context closes it. Raises `StartFailed`."""
        ...
