"""Authorization across replicas: two indexers sharing Redis behind two routers, real processes.

Router A tries indexer 1 first, router B indexer 2 first; each verifies HS256 tokens. Callers with
different tokens find and call different tools whichever router serves them (a handshake session
opened on one is used on the other), a 2026-07-28 caller's implied session is scoped as well, and
the policy file written in place grants and revokes on both routers while the sessions stay open.
Waits are on conditions with bounded timeouts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.ports import free_port
from tests.support.catalogs import small_catalog
from tests.support.clients import until
from tests.support.policies import POLICY_FILE
from tests.support.policy_callers import ROUTER_AUTH, SECRET, SECRET_ENV, mint, policy_file
from tests.support.processes import Proc, start_process
from tests.support.redis import running_redis
from tests.support.stack import (
    CLI,
    HEADERS,
    INITIALIZE,
    START_TIMEOUT,
    grpc_ready,
    structured,
    wait_until,
    write_config,
)

WEATHER = "AI_Weather_by_Meteosource"
NBA = "Free_NBA"
POLICY = f"""
@id("weather-for-all")
permit(principal, action == Action::"call_tool", resource in MCP::"{WEATHER}");

@id("nba-team")
permit(principal in THVGroup::"nba", action == Action::"call_tool", resource in MCP::"{NBA}");
"""
# the change: every caller gets the NBA's tools, and nobody the weather's any more
CHANGED = f"""
@id("nba-for-all")
permit(principal, action == Action::"call_tool", resource in MCP::"{NBA}");
"""
WAIT = 30.0  # seconds any condition may take at most
PROPAGATION = 20.0  # seconds a policy change may take to reach every router
KEPT = "(the policy in force, "  # how an indexer says a file that fails the check changes nothing
QUERY = "nba basketball teams players games weather forecast"


@dataclass
class Replicas:
    """A catalog server, Redis, two indexers and two routers, and the catalog's tools by server."""

    policy: Path
    routers: list[str]  # router A's and B's MCP URLs
    tools: dict[str, set[str]]
    procs: dict[str, Proc] = field(default_factory=dict)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    workdir = tmp_path_factory.mktemp("authorized-replicas")
    catalog = workdir / "catalog.jsonl"
    tools = small_catalog(catalog)
    catalog_port, routers = free_port(), [free_port(), free_port()]
    indexers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    extra = {
        "router": {"auth": ROUTER_AUTH},
        "indexer": {"health": {"enabled": False}, "lease_ttl": 1.0},
        "authorization": policy_file(workdir, POLICY, 1.0),
    }
    config_path, _ = write_config(workdir, catalog, catalog_port, 0, routers[0], extra)
    with running_redis(workdir / "redis") as redis, ExitStack() as cleanup:
        args = [*CLI, "catalog-server", "--catalog", str(catalog), "--port", str(catalog_port), "--control"]
        cleanup.callback(start_process(args, f"http://127.0.0.1:{catalog_port}/healthz").stop)
        found = Replicas(workdir / POLICY_FILE, [f"http://127.0.0.1:{port}/mcp" for port in routers], tools)
        cleanup.callback(lambda: [proc.stop() for proc in found.procs.values()])
        for number, address in enumerate(indexers, start=1):
            env = {"TOOLSEARCH_INDEXER_LISTEN": address, "TOOLSEARCH_INDEXER_STATE": redis.url}
            proc = start_process([*CLI, "indexer", "--config", str(config_path)], None, env=env)
            found.procs[f"indexer{number}"] = proc
            wait_until(lambda a=address: grpc_ready(a), START_TIMEOUT, proc)  # type: ignore[misc]
        for name, port, order in (("A", routers[0], indexers), ("B", routers[1], indexers[::-1])):
            env = {
                "TOOLSEARCH_ROUTER_LISTEN": f"127.0.0.1:{port}",
                "TOOLSEARCH_INDEXER_ADDRESSES": ",".join(order),
                SECRET_ENV: SECRET,
            }
            router = [*CLI, "router", "--config", str(config_path)]
            found.procs[f"router{name}"] = start_process(router, f"http://127.0.0.1:{port}/readyz", env=env)
        yield found


class Caller:
    """A token holder's handshake session, opened on one router and used on either."""

    def __init__(self, subject: str, **claims: Any) -> None:
        self.headers = {**HEADERS, "Authorization": f"Bearer {mint(subject, **claims)}"}

    async def open(self, url: str) -> Caller:
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            response = await http.post(url, json=INITIALIZE, headers=self.headers)
        assert response.status_code == 200, response.text
        self.headers |= {
            "Mcp-Session-Id": response.headers["mcp-session-id"],
            "MCP-Protocol-Version": "2025-11-25",
        }
        return self

    async def tool(self, url: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        body = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            response = await http.post(url, json=body, headers=self.headers)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()["result"]
        return result

    async def found(self, url: str) -> set[str]:
        result = await self.tool(url, "find_tool", {"tool_description": QUERY, "limit": 50})
        return {tool["name"] for tool in result["structuredContent"]["tools"]}

    async def calls(self, url: str, tool: str) -> bool:
        """Whether a call of `tool` runs (False: answered as an unknown tool)."""
        result = await self.tool(url, "call_tool", {"tool_name": tool, "parameters": {}})
        text = str(result["content"][0]["text"]) if result.get("content") else ""
        return not text.startswith(f"tool not found: {tool}.")


async def test_callers_with_different_tokens_find_and_call_different_tools_on_both_routers(
    replicas: Replicas,
) -> None:
    weather, nba = replicas.tools[WEATHER], replicas.tools[NBA]
    guest = await Caller("bob").open(replicas.routers[0])
    fan = await Caller("alice", groups=["nba"]).open(replicas.routers[0])
    for url in replicas.routers:  # the session opened on router A, used on both
        seen = await guest.found(url)
        assert seen and seen <= weather, seen - weather
        assert (await fan.found(url)) & nba
        assert not await guest.calls(url, "Get_All_Teams")
        assert await fan.calls(url, "Get_All_Teams")


async def test_a_2026_07_28_caller_is_scoped_to_its_tools_on_both_routers(replicas: Replicas) -> None:
    for url in replicas.routers:
        for headers, sees_nba in (({}, False), ({"groups": ["nba"]}, True)):
            bearer = {"Authorization": f"Bearer {mint('carol', **headers)}"}
            async with (
                httpx2.AsyncClient(timeout=WAIT, headers=bearer) as http,
                Client(streamable_http_client(url, http_client=http), mode="auto") as client,
            ):
                assert client.protocol_version == "2026-07-28"
                result = await client.call_tool("find_tool", {"tool_description": QUERY, "limit": 50})
                names = {tool["name"] for tool in structured(result)["tools"]}
                assert names and bool(names & replicas.tools[NBA]) is sees_nba, names


async def test_a_policy_file_written_in_place_grants_and_revokes_on_every_router_while_sessions_stay_open(
    replicas: Replicas,
) -> None:
    weather, nba = replicas.tools[WEATHER], replicas.tools[NBA]
    guest = await Caller("bob").open(replicas.routers[0])
    assert not await guest.found(replicas.routers[1]) & nba

    async def everywhere(grant: bool) -> bool:
        for url in replicas.routers:
            seen = await guest.found(url)
            if bool(seen & nba) is not grant or bool(seen & weather) is grant:
                return False
        return True

    replicas.policy.write_text(CHANGED, encoding="utf-8")  # in place: the same file, new bytes
    try:
        await until(lambda: everywhere(True), "the grant and the revocation on both routers", PROPAGATION)
        for url in replicas.routers:
            assert await guest.calls(url, "Get_All_Teams")
            assert not await guest.calls(url, sorted(weather)[0])
    finally:
        replicas.policy.write_text(POLICY, encoding="utf-8")
    await until(lambda: everywhere(False), "the first policy back on both routers", PROPAGATION)


async def test_a_broken_file_written_while_running_keeps_the_policy_in_force_on_every_replica(
    replicas: Replicas,
) -> None:
    nba = replicas.tools[NBA]
    indexers = [proc for name, proc in replicas.procs.items() if name.startswith("indexer")]
    told = [proc.output().count(KEPT) for proc in indexers]
    fan = await Caller("alice", groups=["nba"]).open(replicas.routers[0])
    replicas.policy.write_text(POLICY.replace("resource in", "resource inn", 1), encoding="utf-8")
    try:

        async def logged() -> bool:  # each replica read the broken file and said what stays in force
            return all(proc.output().count(KEPT) > seen for proc, seen in zip(indexers, told, strict=True))

        await until(logged, "each indexer's line on the broken file", PROPAGATION)
        for url in replicas.routers:  # never open: what the last good policy grants, and no more
            assert await fan.found(url) & nba
            guest = await Caller("bob").open(url)  # opened under it, too
            assert not await guest.found(url) & nba
    finally:
        replicas.policy.write_text(POLICY, encoding="utf-8")
