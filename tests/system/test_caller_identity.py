"""Caller identity and credentials end to end: real processes, real tokens, raw HTTP where it matters.

The router runs in jwt mode (HS256). The catalog server requires a JWT on Cocktails, signed with the
same secret and naming the audience `catalog`, so its backend uses passthrough auth: a caller whose
token lacks that audience is rejected there (401) while the router accepts it. A second router over
the same indexer runs in anonymous mode. Every process logs at debug level, so the last test can
look for tokens in everything they wrote. Waits are on conditions with bounded timeouts.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import jwt
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.ports import free_port
from commands.status import fetch
from tests.support.catalogs import small_catalog
from tests.support.clients import until
from tests.support.processes import Proc, start_process
from tests.support.stack import CLI, HEADERS, INITIALIZE, Stack, running_stack

WAIT = 30.0  # seconds any condition may take at most
SECRET = "identity-test-secret-long-enough-for-hs256"
ISSUER = "https://issuer.test"
PROTECTED = "Cocktails"
PROTECTED_TOOLS = {"Search_by_name", "Random_Nonalcoholic", "Search_by_ingredient"}
ENDED = "ended session: backends rejected its stored credentials"
DEBUG = ["--log-level", "debug"]
MINTED: list[str] = []  # every token the tests made, for the log check


def mint(subject: str, expires_in: float = 300, audience: tuple[str, ...] = ("toolsearch", "catalog")) -> str:
    now = time.time()
    claims = {
        "iss": ISSUER,
        "sub": subject,
        "aud": list(audience),
        "iat": int(now),
        "exp": int(now + expires_in),
    }
    token = jwt.encode({**claims, "jti": uuid.uuid4().hex}, SECRET, algorithm="HS256")  # unique per call
    MINTED.append(token)
    return token


def jwt_auth() -> dict[str, Any]:
    # no leeway: the router refuses an expired token at once, as the catalog server does
    return {
        "mode": "jwt",
        "issuer": ISSUER,
        "audience": "toolsearch",
        "hs256_secret_env": "ROUTER_SECRET",
        "leeway": 0,
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    catalog = tmp_path_factory.mktemp("identity-catalog") / "catalog.jsonl"
    small_catalog(catalog)
    extra = {
        "router": {"auth": jwt_auth()},
        "indexer": {"health": {"interval": 0.3, "timeout": 2.0, "unhealthy_after": 1}},
    }
    with running_stack(
        tmp_path_factory.mktemp("identity"),
        catalog=catalog,
        extra=extra,
        require_jwt=[PROTECTED],
        catalog_args=["--jwt-audience", "catalog", *DEBUG],
        env={"TOOLSEARCH_CATALOG_JWT_SECRET": SECRET, "ROUTER_SECRET": SECRET},
        service_args=DEBUG,
    ) as running:
        yield running


@dataclass
class Router:
    url: str
    proc: Proc


@pytest.fixture(scope="module")
def anonymous_router(stack: Stack) -> Iterator[Router]:
    """A second router over the same indexer, authenticating nobody."""
    config = {**stack.config, "router": {**stack.config["router"], "auth": {"mode": "anonymous"}}}
    path = stack.workdir / "anonymous.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    proc = start_process(
        [*CLI, "router", "--config", str(path), *DEBUG],
        f"http://127.0.0.1:{port}/readyz",
        env={"TOOLSEARCH_ROUTER_LISTEN": f"127.0.0.1:{port}"},
    )
    try:
        yield Router(f"http://127.0.0.1:{port}/mcp", proc)
    finally:
        proc.stop()


@pytest.fixture(autouse=True)
def subjects_reset(stack: Stack) -> Iterator[None]:
    yield
    set_subjects(stack, None)
    stack.control(PROTECTED, "up")


def set_subjects(stack: Stack, subjects: list[str] | None) -> None:
    url = f"{stack.catalog_url}/control/servers/{PROTECTED}/subjects"
    # `json=None` would send no body at all: null (every subject) is spelled out
    httpx2.post(url, content=json.dumps(subjects), timeout=5).raise_for_status()


@dataclass
class Mcp:
    """Raw Streamable HTTP to one router, every header under the test's control."""

    url: str

    async def post(
        self, body: dict[str, Any], token: str | None = None, session: str = ""
    ) -> httpx2.Response:
        headers = dict(HEADERS)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if session:
            headers |= {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        async with httpx2.AsyncClient(timeout=30) as http:
            return await http.post(self.url, json=body, headers=headers)

    async def initialize(self, token: str | None = None) -> str:
        response = await self.post(INITIALIZE, token)
        assert response.status_code == 200, response.text
        return str(response.headers["mcp-session-id"])

    async def tool(
        self, session: str, token: str | None, name: str, arguments: dict[str, Any]
    ) -> httpx2.Response:
        body = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }
        return await self.post(body, token, session)

    async def find(self, session: str, token: str | None) -> set[str]:
        """Every tool the session's catalog holds (the small catalog has fewer than 50)."""
        response = await self.tool(session, token, "find_tool", {"tool_description": "cocktail", "limit": 50})
        assert response.status_code == 200, response.text
        return {tool["name"] for tool in response.json()["result"]["structuredContent"]["tools"]}


async def flip(stack: Stack, mcp: Mcp) -> None:
    """Take the protected backend down and up; return once a witness session was rebuilt after it."""
    witness = mint("witness")
    session = await mcp.initialize(witness)
    for action, present in (("down", False), ("up", True)):
        stack.control(PROTECTED, action)
        await until(lambda p=present: _sees(mcp, session, witness, p), f"protected tools present={present}")


async def _sees(mcp: Mcp, session: str, token: str, present: bool) -> bool:
    return bool(await mcp.find(session, token) & PROTECTED_TOOLS) == present


def ended_count(stack: Stack) -> int:
    return stack.procs["indexer"].output().count(ENDED)


async def catalog_refuses(stack: Stack, token: str) -> bool:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {**HEADERS, "Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(timeout=5) as http:
        return (await http.post(stack.backend_url(PROTECTED), json=ping, headers=headers)).status_code == 401


async def test_a_session_whose_stored_token_expired_ends_at_the_next_rebuild_and_the_client_reconnects(
    stack: Stack,
) -> None:
    mcp = Mcp(stack.mcp_url)
    short = mint("alice", expires_in=5)
    session = await mcp.initialize(short)
    assert await mcp.find(session, short) >= PROTECTED_TOOLS
    await until(lambda: catalog_refuses(stack, short), "the short token expired")
    refused = await mcp.tool(session, short, "find_tool", {"tool_description": "cocktail"})
    assert (
        refused.status_code == 401 and "expired" in refused.headers["www-authenticate"]
    )  # the router's own check

    await flip(stack, mcp)
    fresh = mint("alice")
    gone = await mcp.tool(session, fresh, "find_tool", {"tool_description": "cocktail"})
    assert gone.status_code == 404 and gone.json()["error"]["message"] == "session not found: re-initialize"
    assert f"{ENDED}: {PROTECTED}" in stack.procs["indexer"].output()
    again = await mcp.initialize(fresh)
    assert await mcp.find(again, fresh) >= PROTECTED_TOOLS


async def test_a_backend_that_answers_403_on_rebuild_leaves_the_session_alive(stack: Stack) -> None:
    mcp = Mcp(stack.mcp_url)
    dave = mint("dave")
    session = await mcp.initialize(dave)
    assert await mcp.find(session, dave) >= PROTECTED_TOOLS
    ended = ended_count(stack)
    set_subjects(stack, ["witness", "alice"])
    await flip(stack, mcp)
    assert not await mcp.find(session, dave) & PROTECTED_TOOLS  # left out, and the session lives on
    assert ended_count(stack) == ended


async def test_a_backend_that_rejected_the_session_at_creation_does_not_end_it_on_rebuild(
    stack: Stack,
) -> None:
    mcp = Mcp(stack.mcp_url)
    carol = mint("carol", audience=("toolsearch",))  # the router takes it; Cocktails answers 401
    session = await mcp.initialize(carol)
    (status,) = [s for s in fetch(stack.indexer_address, 5.0).sessions if session.startswith(s.session_id)]
    assert list(status.rejected_backends) == [PROTECTED] and status.principal.subject == "carol"
    ended = ended_count(stack)
    await flip(stack, mcp)
    names = await mcp.find(session, carol)
    assert names and not names & PROTECTED_TOOLS
    assert ended_count(stack) == ended


async def test_another_principals_request_gets_404_and_a_refreshed_token_keeps_the_session(
    stack: Stack,
) -> None:
    mcp = Mcp(stack.mcp_url)
    session = await mcp.initialize(mint("alice"))
    hijack = await mcp.tool(session, mint("mallory"), "find_tool", {"tool_description": "cocktail"})
    assert hijack.status_code == 404
    async with httpx2.AsyncClient(timeout=10) as http:
        headers = {"Mcp-Session-Id": session, "Authorization": f"Bearer {mint('mallory')}"}
        assert (await http.delete(stack.mcp_url, headers=headers)).status_code == 404
    missing = await mcp.tool(session, None, "find_tool", {"tool_description": "cocktail"})
    challenge = missing.headers["www-authenticate"]
    assert missing.status_code == 401 and challenge.startswith('Bearer realm="toolsearch", ')
    assert 'resource_metadata="' in challenge  # where a client finds out how to get a token
    assert await mcp.find(session, mint("alice")) >= PROTECTED_TOOLS  # a refreshed token, the same principal
    called = await mcp.tool(
        session, mint("alice"), "call_tool", {"tool_name": "Search_by_name", "parameters": {"name": "mojito"}}
    )
    assert called.json()["result"]["structuredContent"]["arguments"] == {"name": "mojito"}


async def test_an_anonymous_caller_gets_every_backend_but_the_passthrough_one(
    stack: Stack, anonymous_router: Router
) -> None:
    mcp = Mcp(anonymous_router.url)
    session = await mcp.initialize()
    names = await mcp.find(session, None)
    assert "current" in names and not names & PROTECTED_TOOLS
    result = await mcp.tool(
        session, None, "call_tool", {"tool_name": "current", "parameters": {"lat": "50N"}}
    )
    assert result.json()["result"]["structuredContent"]["arguments"] == {"lat": "50N"}
    (status,) = [s for s in fetch(stack.indexer_address, 5.0).sessions if session.startswith(s.session_id)]
    assert list(status.rejected_backends) == [PROTECTED]


async def test_sessions_opened_with_and_without_a_token_never_serve_each_other(
    stack: Stack, anonymous_router: Router
) -> None:
    anonymous, authenticated = Mcp(anonymous_router.url), Mcp(stack.mcp_url)
    token = mint("alice")
    plain = await anonymous.initialize()
    held = await anonymous.initialize(token)  # an anonymous router still passes a token through
    assert await anonymous.find(held, token) >= PROTECTED_TOOLS
    for session, presented in ((plain, token), (held, None)):
        response = await anonymous.tool(session, presented, "find_tool", {"tool_description": "cocktail"})
        assert response.status_code == 404
    crossing = await authenticated.tool(plain, token, "find_tool", {"tool_description": "cocktail"})
    assert crossing.status_code == 404


@asynccontextmanager
async def stateless(url: str, token: str | None, sent: list[httpx2.Request]) -> AsyncIterator[Client]:
    """The SDK's client in its default mode, which speaks 2026-07-28 to a router that does."""

    async def record(request: httpx2.Request) -> None:
        sent.append(request)

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=30, event_hooks={"request": [record]})
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        assert client.protocol_version == "2026-07-28"
        yield client


async def catalog_of(client: Client) -> set[str]:
    result = await client.call_tool("find_tool", {"tool_description": "cocktail", "limit": 50})
    assert not result.is_error and result.structured_content is not None, result
    return {tool["name"] for tool in result.structured_content["tools"]}


async def test_stateless_clients_of_two_principals_never_see_each_others_protected_tools(
    stack: Stack,
) -> None:
    sent: list[httpx2.Request] = []
    alice, bob = mint("alice"), mint("bob", audience=("toolsearch",))  # Cocktails refuses bob
    async with stateless(stack.mcp_url, alice, sent) as a, stateless(stack.mcp_url, bob, sent) as b:
        assert await catalog_of(a) >= PROTECTED_TOOLS
        assert not await catalog_of(b) & PROTECTED_TOOLS
        arguments = {"tool_name": "Search_by_ingredient", "parameters": {"ingredient": "lime"}}
        called = await a.call_tool("call_tool", arguments)
        assert not called.is_error and called.structured_content == {
            "tool": "Search_by_ingredient",
            "server": "Cocktails",
            "arguments": {"ingredient": "lime"},
        }
        refused = await b.call_tool("call_tool", arguments)
        assert refused.is_error and "tool not found: Search_by_ingredient" in str(refused.content[0])
    assert sent and not [r for r in sent if "mcp-session-id" in r.headers]


async def test_stateless_callers_of_an_anonymous_router_share_a_session_that_holds_no_token(
    anonymous_router: Router,
) -> None:
    sent: list[httpx2.Request] = []
    async with (
        stateless(anonymous_router.url, mint("alice"), sent) as holder,
        stateless(anonymous_router.url, None, sent) as nobody,
    ):
        for client in (holder, nobody):
            names = await catalog_of(client)
            assert "current" in names and not names & PROTECTED_TOOLS


async def test_no_token_or_secret_appears_in_any_log(stack: Stack, anonymous_router: Router) -> None:
    mcp = Mcp(stack.mcp_url)
    token = mint("alice")
    session = await mcp.initialize(token)
    called = await mcp.tool(
        session, token, "call_tool", {"tool_name": "Search_by_name", "parameters": {"name": "x"}}
    )
    assert called.status_code == 200
    forged = jwt.encode(
        {"iss": ISSUER, "sub": "alice", "aud": "toolsearch", "exp": int(time.time()) + 60}, "x" * 40
    )
    MINTED.append(forged)
    for refused in (forged, mint("alice", expires_in=-60)):
        assert (await mcp.tool(session, refused, "find_tool", {"tool_description": "x"})).status_code == 401
    anonymous = Mcp(anonymous_router.url)
    await anonymous.find(await anonymous.initialize(token), token)
    logs = "\n".join(proc.output() for proc in [*stack.procs.values(), anonymous_router.proc])
    assert " DEBUG " in logs and "refused a bearer token: the token has expired" in logs
    signatures = [t.rsplit(".", 1)[1] for t in MINTED]
    assert not [t for t in MINTED if t in logs] and not [s for s in signatures if s in logs]
    assert SECRET not in logs
