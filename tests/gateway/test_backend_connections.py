"""Calls to a backend that answers in SSE streams keep their connection: each stream is read to its
end after the answer, so its connection goes back to the pool instead of a new one per call.

The router's backend caller, in process, against a backend of canned SSE answers served by uvicorn on
loopback in the test's loop, which notes the client port of every request (one port, one connection).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from commands.ports import free_port
from router.exchange import BARE
from router.upstream.calls.backends import BackendCaller
from router.upstream.wire import backend_answers
from router.upstream.wire.pools import BackendPools
from tests.support.in_process import serve_app
from toolsearch.outgoing import OutgoingAuth
from toolsearch.targets import BackendTarget

CALLS = 8
MODERN = "2026-07-28"  # no session to open: every request is a call


class SseBackend:
    """Answers every call in an SSE stream: the result's event, then (unless `lingers`) the end."""

    def __init__(self, lingers: bool = False) -> None:
        self.ports: list[int] = []
        self.lingers = lingers
        self.app = Starlette(routes=[Route("/mcp", self._mcp, methods=["POST"])])

    async def _mcp(self, request: Request) -> Response:
        assert request.client is not None
        self.ports.append(request.client.port)
        message = json.loads(await request.body())
        result = {"content": [{"type": "text", "text": "done"}], "resultType": "complete"}

        async def body() -> AsyncIterator[str]:
            yield f"data: {json.dumps({'jsonrpc': '2.0', 'id': message['id'], 'result': result})}\n\n"
            if self.lingers:
                await asyncio.sleep(3600)  # a stream that goes on after its answer

        return StreamingResponse(body(), media_type="text/event-stream")


async def calls_through(backend: SseBackend, calls: int) -> None:
    async with AsyncExitStack() as parts:
        url = await serve_app(backend.app, f"127.0.0.1:{free_port()}", parts)
        pools = BackendPools(4)
        parts.push_async_callback(pools.aclose)
        caller = BackendCaller(pools, None, {})  # type: ignore[arg-type]
        target = BackendTarget("sse", f"{url}/mcp", OutgoingAuth(), MODERN, 10.0, 1_000_000, None)
        for _ in range(calls):
            result = await caller.call_tool(target, "work", {}, BARE)
            assert result["content"] == [{"type": "text", "text": "done"}]


async def test_calls_answered_in_sse_streams_share_one_kept_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # however busy the machine, each stream's end arrives within this
    monkeypatch.setattr(backend_answers, "FINISH_WITHIN", 30.0)
    backend = SseBackend()
    await calls_through(backend, CALLS)
    assert len(backend.ports) == CALLS
    assert len(set(backend.ports)) == 1  # one connection: each call's stream was read to its end


async def test_a_stream_that_goes_on_after_its_answer_still_answers_the_call() -> None:
    backend = SseBackend(lingers=True)
    await asyncio.wait_for(calls_through(backend, 2), 20.0)  # each call waits FINISH_WITHIN at most
    assert len(backend.ports) == 2
