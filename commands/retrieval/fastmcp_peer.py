"""A peer measured beside toolsearch: FastMCP's proxy with its BM25 search transform (PyPI `fastmcp`).

It is the most-used Python way to put one search tool in front of many servers: `create_proxy` over
a configuration of servers, and `BM25SearchTransform`, which hides the tools behind `search_tools`
and `call_tool`. `toolsearch eval` ranks each labelled query with the transform's own search tool
over the catalog in process (`PeerSearch`); `toolsearch bench` runs the proxy as a process in front
of the same catalog server toolsearch fronts (`python -m commands.retrieval.fastmcp_peer`) and sends both the
same queries.

The peer runs as FastMCP ships it: its defaults everywhere but `max_results`, set to the depth the
evaluation reads (10) and to find_tool's default answer (8) in the benchmark. Its tools are named as
its proxy names a configuration's tools (`<server>_<tool>`, each server under its slug, unprefixed
when there is one server), so the search reads the text it would read in front of those servers.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastmcp import Client, FastMCP
from fastmcp.server import create_proxy
from fastmcp.server.transforms.search import BM25SearchTransform
from fastmcp.tools.base import Tool, ToolResult
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from commands.retrieval.scoring import (
    DEPTH,
    PEER,
    PROGRESS_AFTER,
    EvalQuery,
    EvalReport,
    check_labels,
    progress_bar,
    scored,
)
from toolsearch.catalog import CatalogError, CatalogTool, load_catalog

SEARCH_TOOL = "search_tools"  # the transform's search tool, by its default name


def version() -> str:
    """The installed FastMCP's version, for the reports."""
    return importlib.metadata.version("fastmcp")


def peer_names(tools: Sequence[CatalogTool]) -> list[str]:
    """Each tool's name as FastMCP's proxy advertises it: `<server slug>_<name>` over several servers."""
    several = len({tool.server_slug for tool in tools}) > 1
    return [f"{tool.server_slug}_{tool.name}" if several else tool.name for tool in tools]


def searched_names(structured: object) -> list[str]:
    """The tool names of a `search_tools` answer's structured content, best first."""
    found = structured.get("result") if isinstance(structured, dict) else None
    if not isinstance(found, list):
        raise RuntimeError(f"{PEER}: {SEARCH_TOOL} answered without a list of tools: {str(structured)[:200]}")
    return [str(tool.get("name")) for tool in found if isinstance(tool, dict)]


class _ListedTool(Tool):
    """A catalog tool as the search sees it: its definition; the evaluation never calls it."""

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        raise RuntimeError(f"{self.name}: a catalog tool of an evaluation, never called")


class PeerSearch:
    """The transform over a catalog's tools in process, searched through its own `search_tools`."""

    def __init__(self, client: Client[Any]) -> None:
        self._client = client

    @classmethod
    @asynccontextmanager
    async def over(cls, tools: Sequence[CatalogTool], depth: int) -> AsyncIterator[PeerSearch]:
        """The search over `tools`, returning at most `depth` tools a query."""
        # the names are the catalog's servers', some of which SEP-986 frowns on: a warning each, not news
        logging.getLogger("mcp.shared.tool_name_validation").setLevel(logging.ERROR)
        server: FastMCP[Any] = FastMCP(PEER)
        server.add_transform(BM25SearchTransform(max_results=depth))
        for tool, name in zip(tools, peer_names(tools), strict=True):
            schema = tool.input_schema or {"type": "object"}
            listed = _ListedTool(name=name, title=tool.title, description=tool.description, parameters=schema)
            server.add_tool(listed)
        async with Client(server) as client:
            yield cls(client)

    async def rank(self, query: str) -> list[str]:
        """The names the search answers for `query`, best first (none when no word matches)."""
        result = await self._client.call_tool(SEARCH_TOOL, {"query": query})
        return searched_names(result.structured_content)


def evaluate_peer(
    tools: Sequence[CatalogTool], queries: Sequence[EvalQuery], name: str = "", progress: bool | None = None
) -> EvalReport:
    """The peer's search over a catalog and labelled queries, scored as toolsearch's methods are."""
    return asyncio.run(_evaluate(tools, queries, name, progress))


async def _evaluate(
    tools: Sequence[CatalogTool], queries: Sequence[EvalQuery], name: str, progress: bool | None
) -> EvalReport:
    check_labels(tools, queries)
    owner = {peer: tool.id for tool, peer in zip(tools, peer_names(tools), strict=True)}
    rankings: dict[str, list[str]] = {}
    timings: list[float] = []
    show = len(queries) >= PROGRESS_AFTER if progress is None else progress
    async with PeerSearch.over(tools, DEPTH) as search:
        with progress_bar(len(queries), f"searching {name} ({PEER})", show) as bar:
            for query in queries:
                began = time.perf_counter()
                names = await search.rank(query.query)
                timings.append(time.perf_counter() - began)
                rankings[query.id] = [owner[found] for found in names if found in owner]
                bar.update(1)
    return replace(
        scored(PEER, tools, queries, rankings, sum(timings), timings, name), model=f"fastmcp {version()}"
    )


def proxy(catalog_url: str, servers: Sequence[str], depth: int) -> FastMCP[Any]:
    """FastMCP's proxy over each server of a catalog server, with the BM25 search in front."""
    config = {"mcpServers": {slug: {"url": f"{catalog_url}/servers/{slug}/mcp"} for slug in servers}}
    server = create_proxy(config, name=PEER)
    server.add_transform(BM25SearchTransform(max_results=depth))

    @server.custom_route("/healthz", methods=["GET"])
    async def healthz(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return server


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the proxy over HTTP at `/mcp` until stopped."""
    parser = argparse.ArgumentParser(prog="python -m commands.retrieval.fastmcp_peer", description=__doc__)
    parser.add_argument("--catalog", type=Path, required=True, help="the catalog the catalog server serves")
    parser.add_argument("--catalog-url", required=True, help="the catalog server: http://127.0.0.1:9100")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-results", type=int, default=8, help="tools an answer holds (default: 8)")
    args = parser.parse_args(argv)
    try:
        servers = sorted({tool.server_slug for tool in load_catalog(args.catalog)})
    except CatalogError as exc:
        parser.error(str(exc))  # exits 2 with the usage line and what was wrong
    server = proxy(args.catalog_url.rstrip("/"), servers, args.max_results)
    server.run(transport="http", host="127.0.0.1", port=args.port, show_banner=False, log_level="warning")


if __name__ == "__main__":
    main()
