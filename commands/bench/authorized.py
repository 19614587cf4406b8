"""What authorization costs on the real stack: the large catalog's session opens, find_tool and
call_tool under a policy of 100 rules against the same without one, and the indexer's memory with
many callers of different allowed sets, in one run.

One stack (catalog server, indexer, router verifying HS256 tokens) serves both sides: its indexer
runs first without an `authorization` section, then again with one naming `realistic_policy`
(commands/bench/authorization.py: teams, groups, claims, read-only grants, forbids, argument
conditions), the router and the callers' tokens unchanged. The callers are `principals`: each has
its own groups and claims, so nearly each has its own allowed set. Session opens are `initialize` to
the first find_tool answer; cold is a caller's first under a freshly started policy (the first of
all also prepares the catalog for it), warm the same callers again. Memory is read on an indexer
started anew: sessions of one caller, then of every caller, opened over gRPC as the router opens
them (with the caller's verified claims).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import jwt
import mcp_types as types
import yaml
from mcp import Client

from commands.bench.authorization import caller_claims, realistic_policy, stabletoolbench_catalog
from commands.bench.catalogs import call_target
from commands.bench.common import CatalogFile, rss_mb, summarize
from commands.bench.latency import connect
from commands.bench.stack import CLI, CatalogSpec, Stack, http_answers, secret, wait_for
from toolsearch.v1 import indexer_pb2 as pb
from toolsearch.v1 import indexer_pb2_grpc as pb_grpc

ISSUER = "https://bench.toolsearch.test"
AUDIENCE = "toolsearch"
SECRET_ENV = "TOOLSEARCH_BENCH_ROUTER_SECRET"
ADMIN = {"sub": "admin-0", "groups": ["admins"]}  # may call any tool: the call_tool side's caller
SETTLE_SECONDS = 2.0  # let the last allocations land before reading the RSS


class AuthorizedStack:
    """The stack both sides run on, and the tokens of its callers."""

    def __init__(self, stack: Stack, router_secret: str, catalog: CatalogFile) -> None:
        self.stack = stack
        self.secret = router_secret
        config = yaml.safe_load(stack.config_path.read_text())
        config["router"]["auth"] = {
            "mode": "jwt",
            "issuer": ISSUER,
            "audience": AUDIENCE,
            "hs256_secret_env": SECRET_ENV,
        }
        stack.config_path.write_text(yaml.safe_dump(config))
        _, by_backend = stabletoolbench_catalog(path=catalog.path)
        (stack.folder / "policies.cedar").write_text(realistic_policy(by_backend), encoding="utf-8")
        config["authorization"] = {"policies": "policies.cedar"}
        self.with_policy = stack.folder / "toolsearch-policy.yaml"
        self.with_policy.write_text(yaml.safe_dump(config))

    def token(self, claims: dict[str, Any]) -> str:
        now = int(time.time())
        payload = {**claims, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 24 * 3600}
        return jwt.encode(payload, self.secret, algorithm="HS256")

    async def start_router(self) -> None:
        args = [*CLI, "router", "--config", str(self.stack.config_path)]
        proc = self.stack.launch("router", args, {SECRET_ENV: self.secret})
        url = self.stack.mcp_url.removesuffix("/mcp") + "/readyz"
        await wait_for(lambda: http_answers(url), 120, proc)


async def _find(client: Client, query: str) -> None:
    """One find_tool, sent as is; its answer may be empty (a caller allowed nothing of a small catalog)."""
    request = types.CallToolRequest(
        params=types.CallToolRequestParams(name="find_tool", arguments={"tool_description": query})
    )
    result = await client.session.send_request(request, types.CallToolResult)
    if result.is_error:
        raise RuntimeError(f"find_tool failed: {str(result.content)[:300]}")


async def _open(url: str, token: str, query: str) -> float:
    """Seconds from `initialize` to the first find_tool answer."""
    started = time.perf_counter()
    async with connect(url, token) as client:
        await _find(client, query)
        return time.perf_counter() - started


async def _opens(url: str, tokens: Sequence[str], queries: Sequence[str]) -> list[float]:
    return [await _open(url, token, query) for token, query in zip(tokens, queries, strict=True)]


async def _finds(url: str, token: str, queries: Sequence[str]) -> list[float]:
    """find_tool from one session, each query once, after one unmeasured query."""
    times = []
    async with connect(url, token) as client:
        await _find(client, queries[0])
        for query in queries[1:]:
            started = time.perf_counter()
            await _find(client, query)
            times.append(time.perf_counter() - started)
    return times


async def _calls(url: str, token: str, catalog: CatalogFile, calls: int) -> list[float]:
    """call_tool of one tool the caller may use, `calls` times after two unmeasured ones."""
    _, advertised, _, arguments = call_target(catalog)
    times = []
    async with connect(url, token) as client:
        for number in range(calls + 2):
            started = time.perf_counter()
            result = await client.call_tool("call_tool", {"tool_name": advertised, "parameters": arguments})
            if result.is_error:
                raise RuntimeError(f"call_tool of {advertised} failed: {str(result.content)[:300]}")
            if number >= 2:
                times.append(time.perf_counter() - started)
    return times


async def _memory(address: str, pid: int, claims: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """RSS idle, after as many sessions of one caller as there are callers, then of every caller."""
    await asyncio.sleep(SETTLE_SECONDS)
    figures: dict[str, Any] = {"idle": rss_mb(pid)}
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.IndexerStub(channel)

        async def opened(group: Sequence[dict[str, Any]]) -> set[str]:
            fingerprints = set()
            for caller in group:
                request = pb.OpenSessionRequest(
                    principal=pb.Principal(issuer=ISSUER, subject=str(caller["sub"])),
                    claims_json=json.dumps(caller, separators=(",", ":")),
                )
                reply = await stub.OpenSession(request, timeout=600)
                fingerprints.add(reply.version.fingerprint)
            return fingerprints

        one = await opened([claims[0]] * len(claims))
        await asyncio.sleep(SETTLE_SECONDS)
        figures["one_caller"] = {"sessions": len(claims), "versions": len(one), **rss_mb(pid)}
        every = await opened(claims)
        await asyncio.sleep(SETTLE_SECONDS)
        figures["every_caller"] = {"sessions": len(claims), "versions": len(every), **rss_mb(pid)}
    figures["one_caller_delta_mb"] = round(figures["one_caller"]["rss_mb"] - figures["idle"]["rss_mb"], 1)
    figures["every_caller_delta_mb"] = round(
        figures["every_caller"]["rss_mb"] - figures["one_caller"]["rss_mb"], 1
    )
    return figures


async def authorization_part(
    make_stack: Callable[[str, list[CatalogSpec]], Stack],
    catalog: CatalogFile,
    queries: Sequence[str],
    count: int,
    calls: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Every figure of the module docstring. `queries`: 4 * count of them, none repeated; each side's
    find_tool asks the same last `count` on an indexer that has not seen them (its query cache cold)."""
    stack = make_stack("authorization", [CatalogSpec("main", catalog)])
    side = AuthorizedStack(stack, secret(), catalog)
    claims = caller_claims(count)
    tokens = [side.token(caller) for caller in claims]
    opens, cold_opens, warm_opens = (
        queries[:count],
        queries[count : 2 * count],
        queries[2 * count : 3 * count],
    )
    search = list(queries[3 * count : 4 * count])
    out: dict[str, Any] = {"tools": catalog.tools, "callers": count}
    try:
        await stack.start_catalogs()
        progress(f"authorization: indexer without a policy over {catalog.tools} tools")
        await stack.start_indexer()
        await side.start_router()
        url = stack.mcp_url
        progress(f"authorization: without a policy: {count} session opens, find_tool, {calls} call_tool")
        out["session_open_without_policy"] = summarize(await _opens(url, tokens, opens))
        out["find_tool_without_policy"] = summarize(await _finds(url, tokens[1], search))
        out["call_tool_without_policy"] = summarize(await _calls(url, side.token(ADMIN), catalog, calls))
        progress("authorization: the indexer again, with the policy")
        await stack.start_indexer(config=side.with_policy)
        out["policy_rules"] = stack.folder.joinpath("policies.cedar").read_text().count("@id(")
        progress(f"authorization: with the policy: {count} callers' first opens, then again")
        cold = await _opens(url, tokens, cold_opens)
        out["session_open_first_caller_ms"] = round(cold[0] * 1000, 1)  # the catalog prepared too
        out["session_open_cold"] = summarize(cold[1:])
        out["session_open_warm"] = summarize(await _opens(url, tokens, warm_opens))
        out["find_tool_with_policy"] = summarize(await _finds(url, tokens[1], search))
        out["call_tool_with_policy"] = summarize(await _calls(url, side.token(ADMIN), catalog, calls))
        for what in ("find_tool", "call_tool"):
            without = out[f"{what}_without_policy"]["p50_ms"]
            out[f"{what}_p50_ratio"] = (
                round(out[f"{what}_with_policy"]["p50_ms"] / without, 3) if without else None
            )
        progress(f"authorization: memory of {count} callers' sessions on an indexer started anew")
        await stack.start_indexer(config=side.with_policy)
        out["memory"] = await _memory(stack.indexer_address, stack.procs["indexer"].pid, claims)
    finally:
        stack.close()
    return out
