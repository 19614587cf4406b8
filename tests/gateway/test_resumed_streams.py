"""A backend that closes a call's stream before its result (SSE polling, SEP-1699) is followed: the
router resumes the stream with `Last-Event-ID` and the call gets its result.

The router's backend caller against the conformance test server, both in the test's process
(tests/support/conformance_server.py: its `test_reconnection` tool closes the call's stream at once
and leaves the result to a resumption; its event store replays what came after the last event id),
and against a backend of canned SSE answers over an ASGI transport for what can go wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router.errors import BackendUnavailable
from router.exchange import BARE
from router.upstream.calls.backends import BackendCaller
from router.upstream.wire.pools import BackendPools
from tests.support.conformance import conformance_server_in_process
from toolsearch.outgoing import OutgoingAuth
from toolsearch.targets import BackendTarget


@pytest.fixture(scope="module")
def conformance_url() -> Iterator[str]:
    with conformance_server_in_process() as url:
        yield url


HANDSHAKE = "2025-11-25"


def target(url: str) -> BackendTarget:
    return BackendTarget("conf", url, OutgoingAuth(), HANDSHAKE, 10.0, 1_000_000, None)


async def test_a_call_whose_stream_the_backend_closes_early_is_resumed_to_its_result(
    conformance_url: str,
) -> None:
    caller = BackendCaller(BackendPools(4), None, {})  # type: ignore[arg-type]
    result = await caller.call_tool(target(conformance_url), "test_reconnection", {}, BARE)
    assert result["content"] == [{"type": "text", "text": "Reconnection test completed"}]


def polling_backend(
    resumption: Response | None, ids: bool = True, calls: list[str] | None = None
) -> Starlette:
    """A backend whose calls' streams end after a priming event (with an id when `ids`), and whose
    resuming GET is answered `resumption` (a 405 when None); each request's method goes to `calls`."""

    async def mcp(request: Request) -> Response:
        if request.method == "GET":
            assert request.headers["last-event-id"] == "s/1"
            return resumption or Response(status_code=405)
        message = json.loads(await request.body())
        if "id" not in message:
            return Response(status_code=202)
        if message["method"] == "initialize":
            answer = {"protocolVersion": HANDSHAKE, "capabilities": {}, "serverInfo": {"name": "b"}}
            return JSONResponse(
                {"jsonrpc": "2.0", "id": message["id"], "result": answer}, headers={"mcp-session-id": "s"}
            )
        if calls is not None:
            calls.append(message["method"])
        priming = "id: s/1\nretry: 10\ndata: \n\n" if ids else ": no id\n\n"
        return Response(priming, media_type="text/event-stream")

    return Starlette(routes=[Route("/mcp", mcp, methods=["GET", "POST", "DELETE"])])


def sse(message: dict[str, Any]) -> Response:
    return Response(f"id: s/2\ndata: {json.dumps(message)}\n\n", media_type="text/event-stream")


async def test_a_resumed_stream_carries_the_notifications_and_the_result_the_backend_replays() -> None:
    result = {"content": [{"type": "text", "text": "done"}]}
    # the call is the messenger's first request after initialize: its id is 2
    backend = polling_backend(sse({"jsonrpc": "2.0", "id": 2, "result": result}))
    caller = BackendCaller(BackendPools(4, shared=httpx2.ASGITransport(backend)), None, {})  # type: ignore[arg-type]
    answered = await caller.call_tool(target("http://canned/mcp"), "slow", {}, BARE)
    assert answered == result


@pytest.mark.parametrize(
    ("resumption", "ids", "why"),
    [
        (None, True, "answered HTTP 405"),
        (
            JSONResponse({"unexpected": True}),
            True,
            "answered the resumption of a call's stream with HTTP 200",
        ),
        (None, False, "closed the connection without answering"),
    ],
)
async def test_a_stream_that_cannot_be_resumed_is_a_clear_failure(
    resumption: Response | None, ids: bool, why: str
) -> None:
    backend = polling_backend(resumption, ids)
    caller = BackendCaller(BackendPools(4, shared=httpx2.ASGITransport(backend)), None, {})  # type: ignore[arg-type]
    with pytest.raises(BackendUnavailable, match=why):
        await caller.call_tool(target("http://canned/mcp"), "slow", {}, BARE)


async def test_a_session_forgotten_during_a_resumption_fails_the_call_without_running_it_again() -> None:
    calls: list[str] = []
    backend = polling_backend(Response(status_code=404), calls=calls)
    caller = BackendCaller(BackendPools(4, shared=httpx2.ASGITransport(backend)), None, {})  # type: ignore[arg-type]
    resumed = r"forgot its session .* while the call's stream was resumed"
    with pytest.raises(BackendUnavailable, match=resumed):
        await caller.call_tool(target("http://canned/mcp"), "slow", {}, BARE)
    assert calls == ["tools/call"]  # not sent again in a new session: it ran, or runs, in the old one
