"""Pinned tools: listed in tools/list beside the meta-tools, callable by their own names, following
health, with the set fixed for a session. The whole stack as real processes, the SDK's own client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.status import fetch
from tests.support.catalogs import small_catalog
from tests.support.in_process import in_process_stack
from tests.support.stack import Stack
from tests.support.waits import wait_for

COCKTAILS = "Cocktails"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    path = tmp_path_factory.mktemp("pinned-catalog") / "catalog.jsonl"
    names = small_catalog(path)
    assert len(names[COCKTAILS]) == 3
    extra = {
        "router": {"pinned": [f"{COCKTAILS}/*", "Free_NBA/Get_All_Teams"]},
        "indexer": {"health": {"interval": 0.3, "timeout": 10.0, "unhealthy_after": 1}},  # down: 503 at once
    }
    with in_process_stack(tmp_path_factory.mktemp("pinned"), catalog=path, extra=extra) as running:
        yield running


@asynccontextmanager
async def client(url: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient() as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as c,
    ):
        yield c


def _status(stack: Stack, backend_id: str) -> str:
    reply = fetch(stack.indexer_address, 5.0)
    return next((b.status for b in reply.backends if b.id == backend_id), "")


async def test_pinned_tools_are_listed_and_called_by_their_own_names(stack: Stack) -> None:
    async with client(stack.mcp_url) as c:
        names = [t.name for t in (await c.list_tools()).tools]
        result = await c.call_tool("Search_by_ingredient", {"ingredient": "lime"})
    assert names[:2] == ["find_tool", "call_tool"]
    assert sorted(names[2:]) == [
        "Get_All_Teams",
        "Random_Nonalcoholic",
        "Search_by_ingredient",
        "Search_by_name",
    ]
    assert not result.is_error, result
    assert result.structured_content == {
        "tool": "Search_by_ingredient",
        "server": COCKTAILS,
        "arguments": {"ingredient": "lime"},
    }


async def test_a_pinned_tool_follows_health_and_the_set_stays_fixed(stack: Stack) -> None:
    async with client(stack.mcp_url) as c:
        before = sorted(t.name for t in (await c.list_tools()).tools)
        stack.control(COCKTAILS, "down")
        try:
            await wait_for(lambda: _status(stack, COCKTAILS) == "unhealthy", within=30, poll=0.2)
            during = sorted(t.name for t in (await c.list_tools()).tools)
            refused = await c.call_tool("Search_by_name", {"name": "mojito"})
        finally:
            stack.control(COCKTAILS, "up")
        await wait_for(lambda: _status(stack, COCKTAILS) == "healthy", within=30, poll=0.2)
        after = await c.call_tool("Search_by_name", {"name": "mojito"})
    assert during == before  # the list does not change with health: no list_changed is due
    assert refused.is_error
    assert "right now" in refused.content[0].text and "unhealthy" in refused.content[0].text
    assert not after.is_error, after


@pytest.fixture(scope="module")
def always_prefixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    path = tmp_path_factory.mktemp("prefixed-catalog") / "catalog.jsonl"
    small_catalog(path)
    extra = {
        "router": {"pinned": [f"{COCKTAILS}/*"]},
        "indexer": {"naming": {"prefix": "always", "separator": "."}},
    }
    with in_process_stack(tmp_path_factory.mktemp("prefixed"), catalog=path, extra=extra) as running:
        yield running


async def test_pinned_tools_carry_the_names_the_configured_naming_gives_find_tool_too(
    always_prefixed: Stack,
) -> None:
    async with client(always_prefixed.mcp_url) as c:
        listed = [t.name for t in (await c.list_tools()).tools][2:]
        found = await c.call_tool("find_tool", {"tool_description": "search cocktails by an ingredient"})
        result = await c.call_tool(f"{COCKTAILS}.Search_by_ingredient", {"ingredient": "lime"})
    assert sorted(listed) == [
        f"{COCKTAILS}.{name}" for name in ("Random_Nonalcoholic", "Search_by_ingredient", "Search_by_name")
    ]
    assert found.structured_content is not None
    named = {tool["name"] for tool in found.structured_content["tools"]}
    assert f"{COCKTAILS}.Search_by_ingredient" in named
    assert not result.is_error, result
