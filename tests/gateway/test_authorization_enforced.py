"""Authorization enforced end to end: real JWTs with different claims find, list and call different
tools; a denied call answers as an unknown tool does; an argument condition is decided at call time;
a policy written anew grants and revokes while sessions stay open.

A light stack (the indexer in the test's loop, fake embedder) whose router verifies HS256 tokens and
whose indexer enforces a Cedar policy over the catalog server's three backends.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.clients import until
from tests.support.policies import POLICY_FILE
from tests.support.policy_callers import ROUTER_AUTH, SECRET, SECRET_ENV, mint, policy_file
from tests.support.routers import LightStack, light_stack
from tests.support.stack import HEADERS, INITIALIZE

WEATHER = "AI_Weather_by_Meteosource"
NBA = "Free_NBA"
NBA_TOOLS = {
    "Get_a_Specific_Team",
    "Get_All_Games",
    "Get_a_Specific_Game",
    "Get_All_Stats",
    "Get_All_Players",
    "Get_Specific_Player",
    "Get_All_Teams",
}
COCKTAIL_TOOLS = {"Search_by_name", "Random_Nonalcoholic", "Search_by_ingredient"}
POLICY = """
@id("weather-for-all")
permit(principal, action == Action::"call_tool", resource in MCP::"AI_Weather_by_Meteosource");

@id("nba-team")
permit(principal in THVGroup::"nba", action == Action::"call_tool", resource in MCP::"Free_NBA");

@id("no-stats")
forbid(principal, action == Action::"call_tool", resource == Tool::"Get_All_Stats");

@id("margaritas-only")
permit(principal in THVGroup::"bar", action == Action::"call_tool", resource == Tool::"Search_by_name")
when { context has arg_name && context.arg_name == "margarita" };
"""
WAIT = 30.0


class Caller:
    """One token holder speaking Streamable HTTP to the router, in a handshake session."""

    def __init__(self, url: str, subject: str, **claims: Any) -> None:
        self.url, self.token, self.session = url, mint(subject, **claims), ""

    async def post(self, body: dict[str, Any]) -> httpx2.Response:
        headers = {**HEADERS, "Authorization": f"Bearer {self.token}"}
        if self.session:
            headers |= {"Mcp-Session-Id": self.session, "MCP-Protocol-Version": "2025-11-25"}
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            return await http.post(self.url, json=body, headers=headers)

    async def open(self) -> Caller:
        response = await self.post(INITIALIZE)
        assert response.status_code == 200, response.text
        self.session = str(response.headers["mcp-session-id"])
        return self

    async def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        body = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }
        response = await self.post(body)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()["result"]
        return result

    async def found(self, query: str = "nba basketball weather forecast cocktail drink") -> set[str]:
        result = await self.tool("find_tool", {"tool_description": query, "limit": 50})
        return {tool["name"] for tool in result["structuredContent"]["tools"]}

    async def call(self, tool: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return await self.tool("call_tool", {"tool_name": tool, "parameters": parameters})


def not_found_text(result: dict[str, Any], name: str) -> str:
    assert result["isError"] is True, result
    text = str(result["content"][0]["text"])
    ending = r"Use find_tool to search for the tool you need\."
    assert re.fullmatch(rf"tool not found: {re.escape(name)}\.( Closest names: .*\.)? {ending}", text), text
    return text


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[LightStack]:
    authorization = policy_file(tmp_path, POLICY, 0.2)
    async with light_stack(
        tmp_path, router={"auth": ROUTER_AUTH}, env={SECRET_ENV: SECRET}, authorization=authorization
    ) as running:
        yield running


async def test_callers_with_different_claims_find_different_tools(stack: LightStack) -> None:
    fan = await Caller(stack.mcp_url, "alice", groups=["nba"]).open()
    guest = await Caller(stack.mcp_url, "bob").open()
    weather = await guest.found()
    assert weather and not weather & (NBA_TOOLS | COCKTAIL_TOOLS)
    both = await fan.found()
    assert both >= weather | (NBA_TOOLS - {"Get_All_Stats"})
    assert "Get_All_Stats" not in both and not both & COCKTAIL_TOOLS  # a forbid overrides the permit


async def test_a_search_still_fills_its_limit_from_the_allowed_tools(stack: LightStack) -> None:
    guest = await Caller(stack.mcp_url, "bob").open()
    result = await guest.tool(
        "find_tool", {"tool_description": "nba basketball players and games", "limit": 5}
    )
    names = [tool["name"] for tool in result["structuredContent"]["tools"]]
    assert len(names) == 5 and not set(names) & NBA_TOOLS
    assert (
        await guest.found("Get_All_Games") & NBA_TOOLS == set()
    )  # an exact name it may not use: not answered


async def test_a_denied_call_answers_as_an_unknown_tool_and_names_no_tool_the_caller_may_not_use(
    stack: LightStack,
) -> None:
    guest = await Caller(stack.mcp_url, "bob").open()
    visible = await guest.found()
    denied = not_found_text(await guest.call("Get_All_Teams", {"page": "1"}), "Get_All_Teams")
    unknown = not_found_text(await guest.call("Get_All_Teamz", {"page": "1"}), "Get_All_Teamz")
    for text in (denied, unknown):
        named = set(re.findall(r"(\w+) \(server", text))
        assert named <= visible, named - visible
    fan = await Caller(stack.mcp_url, "alice", groups=["nba"]).open()
    allowed = await fan.call("Get_All_Teams", {"page": "1"})
    assert not allowed.get("isError"), allowed
    not_found_text(await fan.call("Get_All_Stats", {"page": "1"}), "Get_All_Stats")
    # counted by the policy that decided (the metric's source): no permit for bob, the forbid for alice
    denials = stack.indexer.sessions.access.denials
    assert denials[("call_tool", "")] == 1 and denials[("call_tool", "no-stats")] == 1


async def test_an_argument_condition_is_decided_when_the_tool_is_called(stack: LightStack) -> None:
    bartender = await Caller(stack.mcp_url, "carol", groups=["bar"]).open()
    assert "Search_by_name" in await bartender.found("find a cocktail by its name")  # conditional: visible
    allowed = await bartender.call("Search_by_name", {"name": "margarita"})
    assert not allowed.get("isError"), allowed
    not_found_text(await bartender.call("Search_by_name", {"name": "mojito"}), "Search_by_name")


async def test_a_2026_07_28_caller_is_scoped_by_the_claims_of_each_token_it_sends(stack: LightStack) -> None:
    seen: dict[str, set[str]] = {}
    for label, claims in (("guest", {}), ("fan", {"groups": ["nba"]}), ("guest again", {})):
        bearer = {"Authorization": f"Bearer {mint('dora', **claims)}"}  # one subject, other groups
        async with (
            httpx2.AsyncClient(timeout=WAIT, headers=bearer) as http,
            Client(streamable_http_client(stack.mcp_url, http_client=http), mode="auto") as client,
        ):
            assert client.protocol_version == "2026-07-28"
            result = await client.call_tool(
                "find_tool", {"tool_description": "nba basketball weather", "limit": 50}
            )
            assert result.structured_content is not None
            seen[label] = {tool["name"] for tool in result.structured_content["tools"]}
    assert seen["guest"] and not seen["guest"] & NBA_TOOLS and seen["fan"] & NBA_TOOLS
    assert seen["guest again"] == seen["guest"]


async def test_a_denial_is_recorded_by_the_router_with_the_policy_that_decided_never_told_the_client(
    stack: LightStack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="router.access_log")
    guest = await Caller(stack.mcp_url, "bob").open()
    fan = await Caller(stack.mcp_url, "alice", groups=["nba"]).open()
    bartender = await Caller(stack.mcp_url, "carol", groups=["bar"]).open()
    answers = [
        await guest.call("Get_All_Teams", {"page": "1"}),  # no policy permits it
        await fan.call("Get_All_Stats", {"page": "1"}),  # a forbid overrides the group's permit
        await bartender.call("Search_by_name", {"name": "mojito"}),  # its arguments decide: no permit
    ]
    assert all(answer["isError"] for answer in answers)
    assert not any("no-stats" in str(answer) or "margaritas" in str(answer) for answer in answers)

    def lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "router.access_log" and r.fields["denied"] != "-"]  # type: ignore[attr-defined]

    async def three() -> list[logging.LogRecord]:  # each line is written once its answer has gone
        return lines() if len(lines()) == 3 else []

    denied = await until(three, "the three denials' access lines", timeout=WAIT)
    assert {r.fields["subject"]: r.fields["denied"] for r in denied} == {  # type: ignore[attr-defined]
        "bob": "call_tool:-",
        "alice": "call_tool:no-stats",
        "carol": "call_tool:-",
    }
    assert any(r.getMessage().endswith(" subject=alice denied=call_tool:no-stats") for r in denied)
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        metrics = (await http.get(f"{stack.router_url}/metrics")).text
    assert 'toolsearch_router_authorization_denials_total{action="call_tool",policy=""} 2.0' in metrics
    assert (
        'toolsearch_router_authorization_denials_total{action="call_tool",policy="no-stats"} 1.0' in metrics
    )


async def test_a_policy_written_anew_grants_and_revokes_while_sessions_stay_open(stack: LightStack) -> None:
    guest = await Caller(stack.mcp_url, "bob").open()
    fan = await Caller(stack.mcp_url, "alice", groups=["nba"]).open()
    assert not await guest.found() & NBA_TOOLS
    granted = POLICY.replace('principal in THVGroup::"nba"', "principal")
    weather = (
        '@id("weather-for-all")\n'
        'permit(principal, action == Action::"call_tool", resource in MCP::"AI_Weather_by_Meteosource");'
    )
    revoked = granted.replace(weather, "")
    assert revoked != granted
    (stack.config_path.parent / POLICY_FILE).write_text(revoked, encoding="utf-8")

    async def changed() -> bool:
        return bool(await guest.found() & NBA_TOOLS) and not await fan.found() & {
            "hourly",
            "daily",
            "current",
        }

    await until(changed, "the new policy's grant and revocation", timeout=20.0)
    assert not (await guest.call("Get_All_Teams", {"page": "1"})).get("isError")
    not_found_text(await fan.call("hourly", {"lat": "1", "lon": "2"}), "hourly")
