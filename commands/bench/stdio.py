"""Part 8: stdio servers, through the bridge.

- **The hop.** A stdio server's tool called through toolsearch (the router, then the bridge, then
  the pipe), beside the same server called over stdio directly by one SDK client session kept open,
  in turns: the server's own time with nothing between. Twice: the bridge speaking the handshake era to the
  server (the SDK's server and client session in front of the pipe), and speaking 2026-07-28 to
  another process of it (`protocol: "2026-07-28"`: requests framed to the pipe as they came), each
  beside the server called directly in the same era.
- **The start.** How long the gateway takes from nothing (`toolsearch up`: the bridge, then the
  indexer and the router) until the stdio server's tool answers through it; and again with a second
  stdio server beside it that never answers `initialize`. A broken server must not hold the others
  back.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
import yaml
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from commands.bench.common import interleaved, summarize
from commands.bench.latency import connect
from commands.bench.stack import CLI, Stack
from commands.ports import free_port

ECHO = [sys.executable, "-m", "commands.bench.stdio_server"]
MODERN_TOOL = "echo_modern"  # the tool of the server the bridge speaks 2026-07-28 to
MODERN = "2026-07-28"
READY_TIMEOUT = 300.0  # seconds from nothing to the tool's first answer, at most
ARGUMENTS = {"text": "hello"}


async def _routed_call(url: str) -> bool:
    """Whether call_tool runs the echo tool through the router now."""
    try:
        async with connect(url) as client:
            result = await client.call_tool("call_tool", {"tool_name": "echo", "parameters": ARGUMENTS})
    except Exception:  # not up yet: the router, the indexer or the bridge
        return False
    return not result.is_error


def _with_stdio(stack: Stack, silent: bool) -> None:
    """Give the stack's configuration a bridge and the echo server (and the silent one)."""
    config = yaml.safe_load(stack.config_path.read_text())
    config["bridge"] = {"listen": f"127.0.0.1:{free_port()}"}
    config["backends"] = [
        {"id": "echo", "command": ECHO[0], "args": ECHO[1:]},
        {"id": "modern", "command": ECHO[0], "args": [*ECHO[1:], MODERN_TOOL], "protocol": MODERN},
    ]
    if silent:
        config["backends"].append({"id": "stuck", "command": ECHO[0], "args": [*ECHO[1:], "silent"]})
    stack.config_path.write_text(yaml.safe_dump(config))


async def gateway_start(stack: Stack, silent: bool) -> float:
    """`toolsearch up` on the stack's configuration; seconds until the tool answers through it."""
    _with_stdio(stack, silent)
    started = time.perf_counter()
    up = stack.launch("up", [*CLI, "up", "--config", str(stack.config_path)])
    with anyio.fail_after(READY_TIMEOUT):
        while not await _routed_call(stack.mcp_url):
            if up.popen.poll() is not None:
                raise RuntimeError(f"up exited with {up.popen.returncode}:\n{up.tail()}")
            await anyio.sleep(0.1)
    return time.perf_counter() - started


async def _hop(router_url: str, tool: str, mode: str, calls: int) -> tuple[list[float], list[float]]:
    """call_tool of `tool` through the router, and `tool` called over stdio by one SDK client session
    kept open (`mode`: its era), `calls` times each, in turns (commands/bench/common.py)."""
    request = types.CallToolRequest(params=types.CallToolRequestParams(name=tool, arguments=ARGUMENTS))
    args = ECHO[1:] if tool == "echo" else [*ECHO[1:], tool]
    server = StdioServerParameters(command=ECHO[0], args=args)
    async with connect(router_url) as routed, Client(stdio_client(server), mode=mode) as direct:
        await routed.list_tools()

        async def through() -> None:
            result = await routed.call_tool("call_tool", {"tool_name": tool, "parameters": ARGUMENTS})
            if result.is_error:
                raise RuntimeError(f"call_tool failed: {result.content}")

        async def own() -> None:
            answer = await direct.session.send_request(request, types.CallToolResult)
            if answer.is_error:
                raise RuntimeError(f"the stdio server refused the call: {answer.content}")

        return await interleaved(through, own, calls)


def _ratio(through: dict[str, Any], direct: dict[str, Any]) -> float | None:
    return round(through["p50_ms"] / direct["p50_ms"], 2) if direct["p50_ms"] else None


async def stdio_hop(router_url: str, calls: int) -> dict[str, Any]:
    """call_tool of each echo tool through the router, beside the server called over stdio directly."""
    through, own = await _hop(router_url, "echo", "legacy", calls)
    through_modern, own_modern = await _hop(router_url, MODERN_TOOL, MODERN, calls)
    figures: dict[str, Any] = {
        "router": summarize(through),
        "stdio_direct": summarize(own),
        "router_modern": summarize(through_modern),
        "stdio_direct_modern": summarize(own_modern),
    }
    figures["router_over_stdio_p50"] = _ratio(figures["router"], figures["stdio_direct"])
    figures["modern_router_over_stdio_p50"] = _ratio(figures["router_modern"], figures["stdio_direct_modern"])
    return figures


async def stdio_part(
    make_stack: Callable[[str], Stack], calls: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    """The hop over the first start's stack, then a second start with a server that never answers."""
    out: dict[str, Any] = {}
    stack = make_stack("stdio")
    try:
        progress("stdio: the gateway's start with one stdio server")
        alone = await gateway_start(stack, silent=False)
        progress(f"stdio: call_tool of a stdio server's tool, {calls} calls, and directly over stdio")
        out["hop"] = await stdio_hop(stack.mcp_url, calls)
    finally:
        stack.close()
    stack = make_stack("stdio-stuck")
    try:
        progress("stdio: the gateway's start beside a stdio server that never answers initialize")
        beside = await gateway_start(stack, silent=True)
    finally:
        stack.close()
    out["start"] = {
        "seconds_to_first_call": round(alone, 2),
        "seconds_to_first_call_beside_a_stuck_server": round(beside, 2),
        "beside_over_alone": round(beside / alone, 2) if alone else None,
    }
    return out
