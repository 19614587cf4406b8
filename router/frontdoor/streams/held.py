"""An event stream the router holds open to a client: one skeleton for the standalone and the
resumed streams.

`hold` answers with `text/event-stream`, runs the stream's own part beside a comment line every
`PING_INTERVAL` (so a client that went away is noticed even when nothing else is sent), and ends
the stream when that part returns, the client disconnects, or the router begins to stop
(`Stopping`, set by SIGTERM: a client opens its stream again on another replica, and the stop need
not wait out its grace for streams that never end by themselves). Each chunk is written whole,
under one lock, with the backpressure of the client's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import anyio
from starlette.types import Receive, Send

logger = logging.getLogger(__name__)

PING_INTERVAL = 15.0  # seconds between two comment lines on an idle stream
_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform")]

# writes one chunk of the stream (whole SSE events)
Write = Callable[[bytes], Awaitable[None]]


class Stopping:
    """Set once the server begins to stop; `wait` returns then (at once if it is set already).

    `set` may be called from a signal handler: each waiter's loop is woken thread-safely.
    """

    def __init__(self) -> None:
        self._stopped = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def set(self) -> None:
        self._stopped = True
        for loop, event in list(self._waiters):
            loop.call_soon_threadsafe(event.set)

    async def wait(self) -> None:
        if self._stopped:
            return
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        self._waiters.append(waiter)
        try:
            await waiter[1].wait()
        finally:
            self._waiters.remove(waiter)


async def hold(
    receive: Receive,
    send: Send,
    stopping: Stopping,
    part: Callable[[Write], Awaitable[object]],
    ends: tuple[type[Exception], ...] = (),
) -> None:
    """Answer with an event stream and run `part(write)` on it until it returns, the client goes, or
    the router stops; `ends` are the exceptions of `part` that end the stream quietly (logged at
    debug), beside the client's connection failing."""
    lock = anyio.Lock()

    async def write(chunk: bytes) -> None:
        async with lock:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def ping() -> None:
        while True:
            await anyio.sleep(PING_INTERVAL)
            await write(b": ping\r\n\r\n")

    async def until_gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    quiet: tuple[type[Exception], ...] = (OSError, *ends)
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    async with anyio.create_task_group() as group:

        async def run(each: Callable[[], Awaitable[object]]) -> None:
            try:
                await each()
            except* quiet as gone:  # the client, or what the stream follows, is gone
                # except*: a part that runs task groups of its own raises them inside a group
                logger.debug("a held stream ended: %r", gone.exceptions[0])
            group.cancel_scope.cancel()

        group.start_soon(run, until_gone)
        group.start_soon(run, stopping.wait)
        group.start_soon(run, ping)
        group.start_soon(run, lambda: part(write))
    with contextlib.suppress(OSError):  # the client that went away needs no end
        await send({"type": "http.response.body", "body": b"", "more_body": False})
