"""A stdio backend configured `protocol: 2026-07-28`: the bridge speaks that protocol to its server.

Real processes: the bridge and the stdio servers it starts are the subject. The server is
tests/support/modern_stdio_server.py (the SDK's `MCPServer`); a handshake-only one stands for a
server configured wrongly. The suite's 2026-07-28 scenarios through it are in test_conformance.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.shared.subscriptions import ToolsListChanged

from bridge.serving.modern_endpoint import MAX_BODY
from tests.support.bridges import Bridge, fake, mcp_client, poll_until, running_bridge

MODERN_SERVER = Path(__file__).resolve().parents[1] / "support" / "modern_stdio_server.py"
VERSION = "2026-07-28"
CALL_TIMEOUT = 10.0  # seconds, the modern backend's call timeout: a busy machine's server answers within it
MAX_LISTENS = 2  # bridge.max_sessions: a 2026-07-28 backend's listens at once


def _envelope() -> dict[str, Any]:
    return {
        types.PROTOCOL_VERSION_META_KEY: VERSION,
        types.CLIENT_INFO_META_KEY: {"name": "test", "version": "1"},
        types.CLIENT_CAPABILITIES_META_KEY: {},
    }


def _call(request_id: int | str, name: str, arguments: dict[str, Any], **meta: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments, "_meta": {**_envelope(), **meta}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def _headers(method: str = "tools/call", name: str | None = None) -> dict[str, str]:
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def _messages(response: httpx2.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an answer, JSON or an event stream."""
    if response.headers["content-type"].startswith("application/json"):
        return [response.json()]
    return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    backends = [
        {
            "id": "modern",
            "command": sys.executable,
            "args": [str(MODERN_SERVER)],
            "protocol": VERSION,
            "timeout": CALL_TIMEOUT,
        },
        fake("echo", id="handshake", protocol=VERSION),  # a server that knows only the handshake
    ]
    folder = tmp_path_factory.mktemp("modern-bridge")
    with running_bridge(folder, backends, max_sessions=MAX_LISTENS) as bridge:
        yield bridge


def test_a_2026_07_28_client_calls_and_listens_through_the_bridge(bridge: Bridge) -> None:
    async def session() -> tuple[list[str], str, list[Any]]:
        async with mcp_client(bridge.mcp_url("modern"), mode=VERSION) as client:
            listed = await client.list_tools()
            counted = await client.call_tool("count_to", {"n": 2})
            async with client.listen(tools_list_changed=True) as changes:
                await client.call_tool("change", {})
                async with asyncio.timeout(10):
                    event = await anext(changes)
            text = counted.content[0]
            assert isinstance(text, types.TextContent)
            return [t.name for t in listed.tools], text.text, [event]

    names, text, events = asyncio.run(session())
    assert {"count_to", "wait", "cancelled", "change", "pid"} <= set(names)
    assert text == "counted to 2"
    assert events == [ToolsListChanged()]


def test_two_callers_with_the_same_progress_token_each_get_their_own_progress(bridge: Bridge) -> None:
    async def both() -> list[list[dict[str, Any]]]:
        async with httpx2.AsyncClient(timeout=30) as http:
            posts = [
                http.post(
                    bridge.mcp_url("modern"),
                    json=_call(1, "count_to", {"n": n}, progressToken="same"),
                    headers=_headers(name="count_to"),
                )
                for n in (3, 5)
            ]
            return [_messages(r) for r in await asyncio.gather(*posts)]

    for n, messages in zip((3, 5), asyncio.run(both()), strict=True):
        progress = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
        assert progress == [{"progressToken": "same", "progress": s, "total": n} for s in range(1, n + 1)]
        assert messages[-1]["id"] == 1
        assert messages[-1]["result"]["content"][0]["text"] == f"counted to {n}"


def test_a_client_that_takes_json_only_gets_the_answer_alone(bridge: Bridge) -> None:
    headers = {**_headers(name="count_to"), "Accept": "application/json"}
    call = _call(4, "count_to", {"n": 3}, progressToken="mine")
    response = httpx2.post(bridge.mcp_url("modern"), json=call, headers=headers, timeout=30)
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["id"] == 4
    assert response.json()["result"]["content"][0]["text"] == "counted to 3"


def test_a_caller_that_leaves_cancels_its_request_at_the_server(bridge: Bridge) -> None:
    before = _cancelled(bridge)

    async def leave() -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(1.0):
                    await http.post(
                        bridge.mcp_url("modern"), json=_call(2, "wait", {}), headers=_headers(name="wait")
                    )

    asyncio.run(leave())
    poll_until(lambda: _cancelled(bridge) == before + 1, 10, "the server saw the call cancelled")


def test_initialize_and_requests_without_the_envelope_are_refused_as_the_protocol_has_it(
    bridge: Bridge,
) -> None:
    url = bridge.mcp_url("modern")
    opening = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}
    response = httpx2.post(url, json=opening, headers=_headers("initialize"))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == types.METHOD_NOT_FOUND
    assert "has no initialize handshake" in response.json()["error"]["message"]

    bare = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    response = httpx2.post(url, json=bare, headers=_headers("tools/list"))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == types.INVALID_PARAMS

    huge = _call(5, "pid", {"text": "x" * MAX_BODY})
    response = httpx2.post(url, json=huge, headers=_headers(name="pid"))
    assert response.status_code == 413
    assert response.json()["error"]["message"] == f"the request is larger than {MAX_BODY} bytes"

    listen = {"jsonrpc": "2.0", "id": 4, "method": "subscriptions/listen", "params": {"_meta": _envelope()}}
    headers = {**_headers("subscriptions/listen"), "Accept": "application/json"}
    response = httpx2.post(url, json=listen, headers=headers)  # a listen is an event stream
    assert response.status_code == 406
    assert "must take application/json and text/event-stream" in response.json()["error"]["message"]

    other = _call(3, "pid", {})
    response = httpx2.post(url, json=other, headers=_headers(name="count_to"))  # the header disagrees
    assert response.status_code == 400
    assert response.json()["error"]["code"] == types.HEADER_MISMATCH


def test_a_server_that_speaks_only_the_handshake_does_not_start_and_says_which_protocol_to_set(
    bridge: Bridge,
) -> None:
    state = poll_until(
        lambda: (s := bridge.health()["handshake"])["last_error"] and s, 30, "the server's start failed"
    )
    assert state["protocol"] == VERSION
    assert "refused server/discover" in state["last_error"]
    assert "protocol: 2025-11-25" in state["last_error"]
    response = httpx2.post(
        bridge.mcp_url("handshake"), json=_call(1, "echo", {}), headers=_headers(name="echo")
    )
    assert response.status_code == 503
    assert "refused server/discover" in response.json()["error"]["message"]


def _cancelled(bridge: Bridge) -> int:
    response = httpx2.post(
        bridge.mcp_url("modern"), json=_call(7, "cancelled", {}), headers=_headers(name="cancelled")
    )
    return int(response.json()["result"]["structuredContent"]["result"])


def test_a_request_the_server_does_not_answer_in_time_is_an_error_and_cancelled_there(bridge: Bridge) -> None:
    before = _cancelled(bridge)
    response = httpx2.post(
        bridge.mcp_url("modern"), json=_call(5, "wait", {}), headers=_headers(name="wait"), timeout=30
    )
    error = _messages(response)[-1]["error"]
    assert error["code"] == types.REQUEST_TIMEOUT
    assert (
        error["message"]
        == f"backend modern: the stdio server did not answer tools/call within {CALL_TIMEOUT:g}s"
    )
    poll_until(lambda: _cancelled(bridge) == before + 1, 10, "the server saw the call cancelled")


def test_listens_beyond_the_bound_are_refused_and_a_server_that_exits_mid_call_is_named_and_restarted(
    bridge: Bridge,
) -> None:
    listen = {
        "jsonrpc": "2.0",
        "method": "subscriptions/listen",
        "params": {"notifications": {"toolsListChanged": True}, "_meta": _envelope()},
    }

    async def listens() -> tuple[list[int], dict[str, Any]]:
        async with httpx2.AsyncClient(timeout=30) as http, contextlib.AsyncExitStack() as held:
            for n in range(MAX_LISTENS):
                request = http.build_request(
                    "POST",
                    bridge.mcp_url("modern"),
                    json={**listen, "id": f"listen-{n}"},
                    headers=_headers("subscriptions/listen"),
                )
                stream = await held.enter_async_context(_streamed(http, request))
                assert stream.status_code == 200  # acknowledged on its stream
            one_more = await http.post(
                bridge.mcp_url("modern"),
                json={**listen, "id": "one-more"},
                headers=_headers("subscriptions/listen"),
            )
            exited = await http.post(
                bridge.mcp_url("modern"), json=_call(9, "exit", {}), headers=_headers(name="exit")
            )
            return [one_more.status_code], {"one_more": one_more.json(), "exited": _messages(exited)[-1]}

    statuses, answers = asyncio.run(listens())
    assert statuses == [503]
    assert (
        answers["one_more"]["error"]["message"] == f"backend modern: {MAX_LISTENS} listens are open already"
    )
    exited = answers["exited"]["error"]["message"]
    assert exited.startswith("backend modern: the stdio server exited with code 3 while answering tools/call")
    poll_until(
        lambda: bridge.health()["modern"]["starts"] >= 2 and bridge.health()["modern"]["state"] == "ready",
        30,
        "the server started again",
    )
    assert _cancelled(bridge) == 0  # a fresh process


@contextlib.asynccontextmanager
async def _streamed(http: httpx2.AsyncClient, request: httpx2.Request) -> AsyncIterator[httpx2.Response]:
    response = await http.send(request, stream=True)
    try:
        yield response
    finally:
        await response.aclose()
