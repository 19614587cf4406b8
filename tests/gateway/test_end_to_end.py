"""The whole path with the SDK's own client: catalog server, indexer and routers as real processes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.clients import Alternating, SessionIds
from tests.support.in_process import in_process_stack
from tests.support.stack import HEADERS, Stack, structured


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with in_process_stack(tmp_path_factory.mktemp("e2e"), routers=2) as running:
        yield running


@asynccontextmanager
async def client(url: str, **http: Any) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(**http) as http_client,
        Client(streamable_http_client(url, http_client=http_client), mode="legacy") as c,
    ):
        yield c


async def find(c: Client, query: str, **extra: Any) -> dict[str, Any]:
    result = await c.call_tool("find_tool", {"tool_description": query, **extra})
    assert not result.is_error, result
    return structured(result)


async def test_tools_list_is_exactly_the_two_meta_tools(stack: Stack) -> None:
    async with client(stack.mcp_url) as c:
        tools = (await c.list_tools()).tools
    assert [t.name for t in tools] == ["find_tool", "call_tool"]
    find_tool, call_tool = tools
    assert find_tool.input_schema["required"] == ["tool_description"]
    assert set(find_tool.input_schema["properties"]) == {"tool_description", "tool_keywords", "limit"}
    assert find_tool.input_schema["properties"]["limit"]["maximum"] == 50
    assert set(call_tool.input_schema["required"]) == {"tool_name", "parameters"}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("validate whether a phone number is a mobile line", "Is_mobile"),
        ("find cocktails that contain a given ingredient", "Search_by_ingredient"),
        ("severe weather alerts for my location", "alerts"),
        ("convert a time from one time zone to another", "time_zone_converter"),
        ("list every NBA team", "Get_All_Teams"),
    ],
)
async def test_find_tool_ranks_the_right_tool_first(stack: Stack, query: str, expected: str) -> None:
    async with client(stack.mcp_url) as c:
        answer = await find(c, query)
    names = [t["name"] for t in answer["tools"]]
    assert names[0] == expected, names
    assert len(names) == 8
    assert all("inputSchema" in t for t in answer["tools"])
    metrics = answer["token_metrics"]
    assert 0 < metrics["returned_tokens"] < metrics["baseline_tokens"]
    assert metrics["savings_percent"] > 90


async def test_find_tool_reports_the_index_version_that_answered(stack: Stack) -> None:
    async with client(stack.mcp_url) as c:
        result = await c.call_tool("find_tool", {"tool_description": "cocktail recipes", "limit": 3})
    index = (result.meta or {})["toolsearch/index"]
    assert index["version"] == 1
    assert len(index["fingerprint"]) == 32
    assert len(structured(result)["tools"]) == 3


async def test_call_tool_returns_the_backends_result_unchanged(stack: Stack) -> None:
    async with client(stack.mcp_url) as c:
        result = await c.call_tool(
            "call_tool", {"tool_name": "Search_by_ingredient", "parameters": {"ingredient": "lime"}}
        )
    assert not result.is_error, result
    assert result.structured_content == {
        "tool": "Search_by_ingredient",
        "server": "Cocktails",
        "arguments": {"ingredient": "lime"},
    }


async def test_call_tool_accepts_the_tool_name_nested_in_parameters(stack: Stack) -> None:
    async with client(stack.mcp_url) as c:
        result = await c.call_tool(
            "call_tool", {"parameters": {"tool_name": "Search_by_name", "name": "mojito"}}
        )
    assert not result.is_error, result
    assert result.structured_content["arguments"] == {"name": "mojito"}


async def test_a_deleted_session_answers_404(stack: Stack) -> None:
    ids = SessionIds()
    async with client(stack.mcp_url, event_hooks={"response": [ids]}) as c:
        await c.list_tools()
    assert len(ids.seen) == 1  # the SDK client sent DELETE on exit
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(
            stack.mcp_url,
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            headers={**HEADERS, "Mcp-Session-Id": ids.seen[0], "MCP-Protocol-Version": "2025-11-25"},
        )
    assert response.status_code == 404


async def test_one_session_is_served_by_two_routers_in_turn(stack: Stack) -> None:
    ports = [int(url.rsplit(":", 1)[1]) for url in stack.router_urls]
    transport = Alternating(ports)
    ids = SessionIds()
    async with client(stack.mcp_url, transport=transport, event_hooks={"response": [ids]}) as c:
        for query in (
            "random cocktail without alcohol",
            "nba players",
            "current weather",
            "format a phone number",
        ):
            answer = await find(c, query, limit=2)
            assert len(answer["tools"]) == 2
        result = await c.call_tool("call_tool", {"tool_name": "Get_All_Teams", "parameters": {}})
        assert not result.is_error, result
    assert set(transport.used) == set(ports)
    assert len(ids.seen) == 1
