"""find_tool answers that say whose each tool is and how well it matched, and call_tool's help for a
wrong name: the whole stack as real processes (a small catalog, quick probes), the SDK's own client.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.status import fetch
from tests.support.catalogs import small_catalog
from tests.support.in_process import in_process_stack
from tests.support.stack import Stack, structured
from tests.support.waits import wait_for
from toolsearch.answers import compact_definition, render_answer
from toolsearch.found import Found, FoundTool, TokenMetrics
from toolsearch.sessions import VersionRef

WEATHER = "AI_Weather_by_Meteosource"
COCKTAILS = "Cocktails"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    path = tmp_path_factory.mktemp("answers-catalog") / "catalog.jsonl"
    small_catalog(path)
    extra = {"indexer": {"health": {"interval": 0.3, "timeout": 2.0, "unhealthy_after": 1}}}
    with in_process_stack(tmp_path_factory.mktemp("answers"), catalog=path, extra=extra) as running:
        yield running


@asynccontextmanager
async def client(url: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient() as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as c,
    ):
        yield c


async def find(c: Client, query: str, **extra: Any) -> dict[str, Any]:
    result = await c.call_tool("find_tool", {"tool_description": query, **extra})
    assert not result.is_error, result
    return structured(result)


async def test_each_tool_names_its_server_and_how_well_it_matched(stack: Stack) -> None:
    async with client(stack.mcp_url) as c:
        answer = await find(c, "find cocktails that contain a given ingredient")
    assert answer["tools"][0]["name"] == "Search_by_ingredient"
    # `found` says of each tool, in order, whose it is and how well it matched
    assert [f["name"] for f in answer["found"]] == [t["name"] for t in answer["tools"]]
    first = answer["found"][0]
    assert first["server"] == COCKTAILS
    assert first["match"] in ("strong", "possible")  # its cosine with the task, whatever the catalog size
    assert {f["match"] for f in answer["found"]} <= {"strong", "possible", "weak"}
    # a server that said something of itself at initialize is described once; these say nothing
    assert set(answer.get("servers", {})) <= {f["server"] for f in answer["found"]}
    assert "message" not in answer and "unavailable" not in answer


async def test_a_compact_answer_keeps_every_input_schema_whole(stack: Stack) -> None:
    query = "weather forecast for the next days"
    async with client(stack.mcp_url) as c:
        full = await find(c, query)
        compact = await find(c, query, compact=True)
    assert [t["name"] for t in compact["tools"]] == [t["name"] for t in full["tools"]]
    for short, whole in zip(compact["tools"], full["tools"], strict=True):
        assert short["inputSchema"] == whole["inputSchema"]
        assert len(short.get("description", "")) <= min(len(whole.get("description", "")), 201)
        assert "outputSchema" not in short and "annotations" not in short
    assert compact["token_metrics"]["returned_tokens"] <= full["token_metrics"]["returned_tokens"]


async def test_when_every_match_is_weak_the_answer_says_nothing_fits_and_names_the_backends_down(
    stack: Stack,
) -> None:
    stack.control(WEATHER, "down")
    try:
        await wait_for(lambda: _status(stack, WEATHER) == "unhealthy", within=30, poll=0.2)
        async with client(stack.mcp_url) as c:
            answer = await find(c, "zzqx vorpal frobnicate the quux")
        assert answer["tools"] and {f["match"] for f in answer["found"]} == {"weak"}
        assert "Nothing here fits this task" in answer["message"]
        assert "Do without a tool" in answer["message"]
        assert f"{WEATHER} (unhealthy)" in answer["message"]
        assert {"backend": WEATHER, "status": "unhealthy"}.items() <= answer["unavailable"][0].items()
        # a tool of the backend that is down is not "not found": it cannot be called right now
        async with client(stack.mcp_url) as c:
            result = await c.call_tool("call_tool", {"tool_name": "historical_weather", "parameters": {}})
        text = result.content[0].text
        assert result.is_error and "unhealthy right now" in text and WEATHER in text and "unhealthy" in text
    finally:
        stack.control(WEATHER, "up")
        await wait_for(lambda: _status(stack, WEATHER) == "healthy", within=30, poll=0.2)


async def test_a_task_whose_needs_fit_in_part_says_which_have_no_tool_here(stack: Stack) -> None:
    task = "Find cocktails that contain a given ingredient. Then knead the sourdough and bake the loaf."
    async with client(stack.mcp_url) as c:
        answer = await find(c, task)
    assert answer["found"][0]["server"] == COCKTAILS and answer["found"][0]["match"] != "weak"
    message = answer["message"]
    assert "No tool below serves" in message and "knead the sourdough" in message
    assert "Nothing here fits" not in message
    assert message.index("knead the sourdough") < message.index("cocktails")


async def test_a_misspelt_name_gets_the_closest_names_and_their_servers(stack: Stack) -> None:
    async with client(stack.mcp_url) as c:
        result = await c.call_tool(
            "call_tool", {"tool_name": "search_by_ingrediant", "parameters": {"ingredient": "lime"}}
        )
        unknown = await c.call_tool("call_tool", {"tool_name": "qqqq_zzzz", "parameters": {}})
    assert result.is_error
    text = result.content[0].text
    assert text.startswith("tool not found: search_by_ingrediant. Closest names: Search_by_ingredient")
    assert f"(server {COCKTAILS}" in text and "find_tool" in text
    assert unknown.is_error and "Closest names" not in unknown.content[0].text
    assert "find_tool" in unknown.content[0].text


def _status(stack: Stack, backend_id: str) -> str:
    reply = fetch(stack.indexer_address, 5.0)
    return next((b.status for b in reply.backends if b.id == backend_id), "")


def test_an_answer_describes_each_server_once_and_keeps_definitions_as_they_are() -> None:
    definition = {"name": "get_price", "description": "Price of a thing", "inputSchema": {"type": "object"}}
    shop = ("Shop", "Prices and stock of the shop. " + "x" * 400)
    crypto = json.dumps({**definition, "name": "crypto_get_price"})
    tools = (
        FoundTool("get_price", "shop", json.dumps(definition), *shop, "strong"),
        FoundTool("crypto_get_price", "crypto", crypto, "", "", "weak"),
    )
    metrics = TokenMetrics(baseline_tokens=10, returned_tokens=5, savings_percent=50.0)
    structured, text = render_answer(Found(VersionRef(1, "f"), tools, (), metrics, note="weak"))
    assert json.loads(text) == structured
    assert structured["tools"][0] == definition  # the MCP definition, untouched
    assert structured["found"] == [
        {"name": "get_price", "server": "shop", "match": "strong"},
        {"name": "crypto_get_price", "server": "crypto", "match": "weak"},
    ]
    shop = structured["servers"]["shop"]
    assert list(structured["servers"]) == ["shop"] and shop["title"] == "Shop"
    assert shop["description"].startswith("Prices and stock of the shop.") and len(shop["description"]) <= 301
    short = compact_definition({**definition, "title": "get price", "outputSchema": {}, "annotations": None})
    assert short == definition
