"""Part 10: a peer in the same run: FastMCP's proxy with its BM25 search transform, beside toolsearch.

The proxy (`commands.retrieval.fastmcp_peer`: FastMCP as it ships, but 8 results a search, find_tool's default
answer) runs as a process in front of the small stack's catalog server, each of its servers one
entry of the proxy's configuration, as toolsearch's indexer has them. Both get the same queries at
1, 8 and 32 concurrent clients, each client a session of its own made by the SDK's client; set by
set and client count by client count, toolsearch first and the peer right after, so that a change
in the machine's other load lands on both.

FastMCP's proxy keeps no listing between requests: every search lists every server's tools again
(its response cache would cache the search's own synthetic listing instead), so a search's time
grows with the number of servers and the peer gets fewer queries than find_tool's own runs
(`Plan.peer_per_client`, the first queries of each client's list).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mcp import Client

from commands.bench.common import CatalogFile
from commands.bench.latency import find_tool_load
from commands.bench.plan import QUERY_SETS
from commands.bench.stack import Stack, http_answers, wait_for
from commands.ports import free_port
from commands.retrieval.fastmcp_peer import SEARCH_TOOL, searched_names, version
from commands.retrieval.scoring import PEER

READY_TIMEOUT = 120.0  # seconds for the proxy to serve: it connects to no server before a request


async def peer_find(client: Client, query: str) -> list[str]:
    """One search through the peer, the way an application calls it; raises on an error answer."""
    result = await client.call_tool(SEARCH_TOOL, {"query": query})
    if result.is_error:
        text = result.content[0].text if result.content and hasattr(result.content[0], "text") else ""
        raise RuntimeError(f"{PEER}: {SEARCH_TOOL} failed: {text[:300]}")
    return searched_names(result.structured_content)


async def start_peer(stack: Stack, catalog: CatalogFile) -> str:
    """Start the proxy in front of the stack's catalog server; returns its MCP URL once it serves."""
    port = free_port()
    args = [sys.executable, "-m", "commands.retrieval.fastmcp_peer", "--catalog", str(catalog.path)]
    args += ["--catalog-url", stack.catalogs["main"].url, "--port", str(port)]
    proc = stack.launch("peer", args)
    await wait_for(functools.partial(http_answers, f"http://127.0.0.1:{port}/healthz"), READY_TIMEOUT, proc)
    return f"http://127.0.0.1:{port}/mcp"


async def peer_part(
    stack: Stack,
    catalog: CatalogFile,
    queries: Mapping[str, Mapping[int, Sequence[Sequence[str]]]],
    warmups: Mapping[str, Sequence[str]],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """find_tool through the stack's router and the peer's search, with the same queries each.

    `queries`: per query set, per number of clients, each client's queries; `warmups`: per query
    set, the queries a separate client sends first (unmeasured) to each.
    """
    url = await start_peer(stack, catalog)
    peer_pid = stack.procs["peer"].pid
    ours = {name: pid for name, pid in stack.pids().items() if name != "peer"} | {"bench": os.getpid()}
    theirs = {"peer": peer_pid, "catalog-main": stack.procs["catalog-main"].pid, "bench": os.getpid()}
    out: dict[str, Any] = {
        "fastmcp": version(),
        "tools": catalog.tools,
        "servers": len(catalog.servers),
        "find": {},
    }
    for name in QUERY_SETS:
        runs: dict[str, Any] = {}
        for clients, per_client in queries[name].items():
            progress(f"peer: {name} queries, {clients} concurrent clients: toolsearch, then {PEER}")
            mine = await find_tool_load(stack.mcp_url, per_client, warmups[name], ours)
            peer = await find_tool_load(url, per_client, warmups[name], theirs, finder=peer_find)
            own = mine["p50_ms"]
            runs[str(clients)] = {
                "toolsearch": mine,
                PEER: peer,
                "peer_over_toolsearch_p50": round(peer["p50_ms"] / own, 2) if own and peer["count"] else None,
            }
        out["find"][name] = runs
    stack.stop("peer")
    return out
