"""What several tests need around the SDK's client: recording session ids, spreading requests over
routers, and waiting for a condition with a bound."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2

WAIT = 30.0  # seconds any condition may take at most


class SessionIds:
    """Records the Mcp-Session-Id values a router issues to a client (an httpx2 response hook)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, response: httpx2.Response) -> None:
        session_id = response.headers.get("mcp-session-id")
        if session_id and session_id not in self.seen:
            self.seen.append(session_id)


class Alternating(httpx2.AsyncBaseTransport):
    """Sends each request to the next router in turn: one session served by several replicas."""

    def __init__(self, ports: list[int]) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._ports = itertools.cycle(ports)
        self.used: list[int] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = next(self._ports)
        self.used.append(port)
        request.url = request.url.copy_with(port=port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = WAIT) -> Any:
    """Run `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := await check():
            return result
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")
