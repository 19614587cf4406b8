"""Bad input gets a clear answer, and nothing crashes: the stack keeps serving after each."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from tests.support.clients import until
from tests.support.in_process import in_process_stack
from tests.support.routers import light_stack
from tests.support.stack import HEADERS, INITIALIZE, Stack, open_session, structured


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with in_process_stack(tmp_path_factory.mktemp("bad")) as running:
        yield running


def session(stack: Stack) -> str:
    return open_session(stack.mcp_url)


def post(
    stack: Stack, body: Any, session_id: str | None = None, raw: bytes | None = None, **headers: str
) -> httpx2.Response:
    sent = {**HEADERS, "MCP-Protocol-Version": "2025-11-25", **headers}
    if session_id:
        sent["Mcp-Session-Id"] = session_id
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx2.post(stack.mcp_url, content=content, headers=sent, timeout=30)


def call(stack: Stack, session_id: str, name: str, arguments: Any) -> dict[str, Any]:
    response = post(
        stack,
        {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": arguments}},
        session_id,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def error_text(reply: dict[str, Any]) -> str:
    result = reply["result"]
    assert result["isError"] is True, reply
    return str(result["content"][0]["text"])


async def still_serves(mcp_url: str) -> None:
    async with Client(mcp_url, mode="legacy") as client:
        result = await client.call_tool("find_tool", {"tool_description": "cocktail recipes", "limit": 1})
    assert len(structured(result)["tools"]) == 1


async def test_malformed_json_is_a_parse_error(stack: Stack) -> None:
    response = post(stack, None, raw=b'{"jsonrpc": "2.0", "id": 1, "method": ')
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32700
    await still_serves(stack.mcp_url)


@pytest.mark.parametrize(
    "body",
    [[], 42, "initialize", {"jsonrpc": "1.0", "id": 1, "method": "tools/list"}, {"id": 1, "params": {}}],
)
async def test_a_body_that_is_not_a_jsonrpc_request_is_refused(stack: Stack, body: Any) -> None:
    response = post(stack, body, session(stack))
    assert 400 <= response.status_code < 500
    assert "error" in response.json()


async def test_an_unknown_method_is_method_not_found(stack: Stack) -> None:
    response = post(stack, {"jsonrpc": "2.0", "id": 3, "method": "tools/explode"}, session(stack))
    assert response.status_code < 500
    assert response.json()["error"]["code"] == -32601


async def test_an_unknown_session_id_is_404(stack: Stack) -> None:
    response = post(stack, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, "no-such-session")
    assert response.status_code == 404


async def test_a_request_without_a_session_id_is_400(stack: Stack) -> None:
    response = post(stack, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
    assert response.status_code == 400
    assert "Mcp-Session-Id" in response.json()["error"]["message"]


async def test_a_missing_tool_description_names_the_field(stack: Stack) -> None:
    assert "tool_description" in error_text(call(stack, session(stack), "find_tool", {"limit": 3}))


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"tool_description": 12}, "tool_description"),
        ({"tool_description": "x", "limit": "ten"}, "limit"),
        ({"tool_description": "x", "limit": 0}, "limit"),
        ({"tool_description": "x", "limit": 500}, "limit"),
        ({"tool_description": "x", "tool_keywords": [1, 2]}, "tool_keywords"),
    ],
)
async def test_wrong_argument_types_in_find_tool_name_the_field(
    stack: Stack, arguments: dict[str, Any], field: str
) -> None:
    assert field in error_text(call(stack, session(stack), "find_tool", arguments))


async def test_an_empty_query_says_why_nothing_came_back(stack: Stack) -> None:
    text = error_text(call(stack, session(stack), "find_tool", {"tool_description": "   "}))
    assert "tool_description" in text
    assert "empty" in text


async def test_a_ten_thousand_character_query_is_refused_clearly(stack: Stack) -> None:
    text = error_text(call(stack, session(stack), "find_tool", {"tool_description": "weather " * 1250}))
    assert "tool_description" in text
    await still_serves(stack.mcp_url)


async def test_an_unknown_tool_points_at_find_tool(stack: Stack) -> None:
    text = error_text(
        call(stack, session(stack), "call_tool", {"tool_name": "launch_rockets", "parameters": {}})
    )
    assert "tool not found: launch_rockets" in text
    assert "find_tool" in text


async def test_arguments_that_break_the_schema_name_the_field(stack: Stack) -> None:
    text = error_text(
        call(stack, session(stack), "call_tool", {"tool_name": "Search_by_ingredient", "parameters": {}})
    )
    assert "ingredient" in text


async def test_call_tool_without_parameters_object_names_the_field(stack: Stack) -> None:
    reply = call(stack, session(stack), "call_tool", {"tool_name": "Search_by_name", "parameters": [1, 2]})
    assert "parameters" in error_text(reply)


async def test_a_backend_that_is_down_is_a_clear_tool_error(stack: Stack) -> None:
    stack.control("Cocktails", "down")
    try:
        text = error_text(
            call(
                stack,
                session(stack),
                "call_tool",
                {"tool_name": "Search_by_name", "parameters": {"name": "x"}},
            )
        )
    finally:
        stack.control("Cocktails", "up")
    assert "Cocktails" in text


async def test_a_backend_that_hangs_times_out_without_stalling_others(tmp_path: Any) -> None:
    extra = {"indexer": {"health": {"enabled": False}}}
    with in_process_stack(tmp_path, extra=extra, backend_timeout=5.0) as stack:
        async with Client(stack.mcp_url, mode="legacy") as client:
            stack.control("Cocktails", "slow", seconds=60)
            async with anyio.create_task_group() as group:
                hung: dict[str, Any] = {}

                async def call_the_hanging_backend() -> None:
                    hung["result"] = await client.call_tool(
                        "call_tool", {"tool_name": "Search_by_name", "parameters": {"name": "x"}}
                    )

                group.start_soon(call_the_hanging_backend)
                other = await client.call_tool("call_tool", {"tool_name": "Get_All_Teams", "parameters": {}})
                assert not other.is_error, other
                assert "result" not in hung  # answered while the other call hangs
            assert hung["result"].is_error
            assert "Cocktails" in hung["result"].content[0].text
            assert "5s" in hung["result"].content[0].text


async def test_an_indexer_that_is_down_gives_503_and_recovers(tmp_path: Path) -> None:
    """The indexer, served from the test's loop, stops and starts again on its port."""
    tools_list = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
    async with light_stack(tmp_path) as stack, httpx2.AsyncClient(timeout=30) as http:
        opened = await http.post(stack.mcp_url, json=INITIALIZE, headers=HEADERS)
        in_session = {
            **HEADERS,
            "MCP-Protocol-Version": "2025-11-25",
            "Mcp-Session-Id": opened.headers["mcp-session-id"],
        }
        await stack.indexers.stop()
        response = await http.post(stack.mcp_url, json=tools_list, headers=in_session)
        assert response.status_code == 503
        assert "indexer unavailable" in response.json()["error"]["message"]
        assert (await http.get(f"{stack.router_url}/readyz")).status_code == 503
        await stack.indexers.start()

        async def ready() -> bool:
            return (await http.get(f"{stack.router_url}/readyz")).status_code == 200

        await until(ready, "the router ready again with the indexer back", timeout=30)
        # the restarted indexer (memory state) does not know the old session: re-initialize
        assert (await http.post(stack.mcp_url, json=tools_list, headers=in_session)).status_code == 404
        await still_serves(stack.mcp_url)
