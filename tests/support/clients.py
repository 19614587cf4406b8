"""What several tests need around the SDK's client: recording session ids, spreading requests over
routers, waiting for a condition with a bound, and a raw JSON-RPC client whose session any router
replica may serve."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2

from tests.support.stack import HEADERS, INITIALIZE
from tests.support.waits import wait_for

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


class RawClient:
    """A handshake-era client session, posted to whichever router replica a call names."""

    def __init__(self, http: httpx2.AsyncClient) -> None:
        self.http = http
        self.session_id = ""
        self._id = 1

    async def initialize(self, mcp_url: str, capabilities: dict[str, Any] | None = None) -> None:
        """Open the session, declaring `capabilities` (none by default)."""
        params = {**INITIALIZE["params"], "capabilities": capabilities or {}}
        response = await self.http.post(mcp_url, json={**INITIALIZE, "params": params}, headers=HEADERS)
        assert response.status_code == 200, response.text
        self.session_id = response.headers["mcp-session-id"]
        notified = await self.http.post(
            mcp_url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=self.headers()
        )
        assert notified.status_code == 202, notified.text

    def headers(self) -> dict[str, str]:
        return {**HEADERS, "Mcp-Session-Id": self.session_id, "MCP-Protocol-Version": "2025-11-25"}

    def next_id(self) -> int:
        self._id += 1
        return self._id

    async def call(
        self, mcp_url: str, name: str, parameters: dict[str, Any], request_id: int | None = None
    ) -> dict[str, Any]:
        """call_tool through the router at `mcp_url` (under `request_id`, if given); the tool result."""
        params = {"name": "call_tool", "arguments": {"tool_name": name, "parameters": parameters}}
        message = {
            "jsonrpc": "2.0",
            "id": request_id or self.next_id(),
            "method": "tools/call",
            "params": params,
        }
        response = await self.http.post(mcp_url, json=message, headers=self.headers())
        assert response.status_code == 200, response.text
        answers = _messages(response)
        result: dict[str, Any] = next(m["result"] for m in answers if m.get("id") == message["id"])
        return result

    async def call_answering(
        self,
        mcp_url: str,
        name: str,
        parameters: dict[str, Any],
        answer_url: str,
        answer: Callable[[dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any] | None] | None],
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """call_tool through `mcp_url`, its answer read as a stream: each request of the client on it
        is answered with `answer(request)` (a result, or a coroutine of one; None: left
        unanswered), posted to `answer_url`, which may be another replica. Returns the tool result
        and the requests."""
        params = {"name": "call_tool", "arguments": {"tool_name": name, "parameters": parameters}}
        return await self.request_answering(mcp_url, "tools/call", params, answer_url, answer)

    async def request_answering(
        self,
        mcp_url: str,
        method: str,
        params: dict[str, Any],
        answer_url: str,
        answer: Callable[[dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any] | None] | None],
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One request answered with a stream, the client's requests on it answered as
        `call_answering` does; its result and those requests."""
        call_id = self.next_id()
        message = {"jsonrpc": "2.0", "id": call_id, "method": method, "params": params}
        asked: list[dict[str, Any]] = []
        async with self.http.stream("POST", mcp_url, json=message, headers=self.headers()) as response:
            assert response.status_code == 200, await response.aread()
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                if not line.startswith("data:") or not line[5:].strip():
                    continue
                event = json.loads(line[5:])
                if event.get("id") == call_id and "method" not in event:
                    return event["result"], asked
                if "method" in event and "id" in event:
                    asked.append(event)
                    result = answer(event)
                    if inspect.isawaitable(result):
                        result = await result
                    if result is not None:
                        reply = {"jsonrpc": "2.0", "id": event["id"], "result": result}
                        posted = await self.http.post(answer_url, json=reply, headers=self.headers())
                        assert posted.status_code == 202, posted.text
        raise AssertionError(f"the stream of {method} ended without its result")

    async def request(
        self, mcp_url: str, method: str, params: dict[str, Any]
    ) -> tuple[int, list[dict[str, Any]]]:
        """One request; the answer's HTTP status and its JSON-RPC messages (one JSON body, or each
        event of an SSE stream, the result last)."""
        message = {"jsonrpc": "2.0", "id": self.next_id(), "method": method, "params": params}
        response = await self.http.post(mcp_url, json=message, headers=self.headers())
        return response.status_code, _messages(response)

    async def notify(self, mcp_url: str, method: str, params: dict[str, Any]) -> None:
        message = {"jsonrpc": "2.0", "method": method, "params": params}
        response = await self.http.post(mcp_url, json=message, headers=self.headers())
        assert response.status_code == 202, response.text

    async def end(self, mcp_url: str) -> None:
        response = await self.http.delete(mcp_url, headers=self.headers())
        assert response.status_code == 200, response.text


def _messages(response: httpx2.Response) -> list[dict[str, Any]]:
    """An answer's JSON-RPC messages: one JSON body, or each event of an SSE stream."""
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        return [response.json()]
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    return [json.loads(d) for d in data if d]


class Listener:
    """A client session's standalone stream, read in the background: the messages so far, and the
    id of the last event that had one; opened from `last_event_id` (`Last-Event-ID`) when given."""

    def __init__(
        self, http: httpx2.AsyncClient, client: RawClient, url: str, last_event_id: str = ""
    ) -> None:
        self.http, self.client, self.url = http, client, url
        self.messages: list[dict[str, Any]] = []
        self.last_id = last_event_id
        self.status = 0
        self.ended = False  # the router ended the stream whole (a broken one raises instead)

    async def run(self) -> None:
        headers = {**self.client.headers(), "Accept": "text/event-stream"}
        if self.last_id:
            headers["Last-Event-ID"] = self.last_id
        async with self.http.stream("GET", self.url, headers=headers) as response:
            self.status = response.status_code
            async for line in response.aiter_lines():
                if line.startswith("id:"):
                    self.last_id = line[3:].strip()
                elif line.startswith("data:") and line[5:].strip():
                    self.messages.append(json.loads(line[5:]))
        self.ended = True


@contextlib.asynccontextmanager
async def listening(
    http: httpx2.AsyncClient, client: RawClient, url: str, last_event_id: str = ""
) -> AsyncIterator[Listener]:
    listener = Listener(http, client, url, last_event_id)
    task = asyncio.create_task(listener.run())
    try:
        await wait_for(lambda: listener.status != 0 or task.done())
        yield listener
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
