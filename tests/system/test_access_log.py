"""One access line per MCP request, with what an operator asks of it, and never the caller's token.

A real router process (JSON logs) in front of the test's indexer, with JWT auth on; a real MCP client
calls find_tool and call_tool, and the router's own output is read back.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import jwt
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.routers import LightStack, light_stack
from tests.support.stack import INITIALIZE
from tests.support.waits import wait_for

SECRET = "access-log-secret-of-32-bytes-at-least"
ISSUER = "https://issuer.test"
WAIT = 30.0


def token(subject: str) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": subject, "aud": "toolsearch", "iat": now, "exp": now + 300}
    return jwt.encode(claims, SECRET, algorithm="HS256")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LightStack]:
    auth = {"mode": "jwt", "issuer": ISSUER, "audience": "toolsearch", "hs256_secret_env": "ACCESS_JWT"}
    folder = tmp_path_factory.mktemp("access")
    json_logs = ["--log-format", "json"]
    async with light_stack(
        folder, router={"auth": auth}, env={"ACCESS_JWT": SECRET}, router_args=json_logs
    ) as running:
        yield running


def access_lines(stack: LightStack) -> list[dict[str, Any]]:
    lines = []
    for line in stack.router.output().splitlines():
        if '"router.access_log"' in line:
            lines.append(json.loads(line))
    return lines


async def new_lines(
    stack: LightStack, before: int, count: int, method: str | None = None
) -> list[dict[str, Any]]:
    """The lines after the first `before`, once there are `count` of them (and one for `method`).

    A line of an earlier test's request (its client's DELETE, say) may still arrive among them.
    """

    def arrived() -> bool:
        lines = access_lines(stack)[before:]
        return len(lines) >= count and (method is None or any(line["method"] == method for line in lines))

    await wait_for(arrived, within=WAIT)
    return access_lines(stack)[before:]


@asynccontextmanager
async def client(stack: LightStack, bearer: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=WAIT)
    async with http, Client(streamable_http_client(stack.mcp_url, http_client=http), mode="legacy") as mcp:
        yield mcp


async def test_each_mcp_request_gets_one_line_naming_tool_backend_outcome_version_and_subject(
    stack: LightStack,
) -> None:
    bearer = token("alice")
    before = len(access_lines(stack))
    async with client(stack, bearer) as mcp:
        found = await mcp.call_tool("find_tool", {"tool_description": "list all NBA teams"})
        version = found.meta["toolsearch/index"] if found.meta else {}
        result = await mcp.call_tool("call_tool", {"tool_name": "Get_All_Teams", "parameters": {}})
        assert not result.is_error
    lines = await new_lines(stack, before, 4)  # initialize, initialized, find_tool, call_tool
    by_tool = {line["tool"]: line for line in lines if line["method"] == "tools/call"}
    find, call = by_tool["find_tool"], by_tool["call_tool"]
    assert find["outcome"] == "ok" and find["status"] == 200 and find["target"] == "-"
    assert call["outcome"] == "ok" and call["target"] == "Get_All_Teams"
    assert call["backend"] == "Free_NBA"  # the catalog server's backend id
    fingerprint = version.get("fingerprint", "")
    assert fingerprint and find["index"] == f"v{version['version']}/{fingerprint[:12]}"
    assert call["index"] == find["index"]
    # the client's GET holds its standalone stream for the session, and is logged when it ends
    posts = [line for line in lines if line["http_method"] == "POST"]
    assert {line["subject"] for line in posts} == {"alice"}
    assert {line["status"] for line in lines if line["http_method"] == "GET"} <= {200}
    assert all(isinstance(line["ms"], float | int) and line["ms"] >= 0 for line in lines)
    assert [line["method"] for line in posts].count("initialize") == 1
    # one session, named by a hash
    sessions = {line["session"] for line in posts}
    assert len(sessions) == 1 and next(iter(sessions)).startswith("#")
    assert all(line["message"].startswith("mcp POST ") for line in posts)


async def test_the_session_is_a_hash_of_its_id_and_no_token_reaches_the_log(stack: LightStack) -> None:
    bearer = token("bob")
    headers = {"Authorization": f"Bearer {bearer}", "Accept": "application/json, text/event-stream"}
    before = len(access_lines(stack))
    async with httpx2.AsyncClient(timeout=WAIT, headers=headers) as http:
        opened = await http.post(stack.mcp_url, json=INITIALIZE)
        session_id = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        listed = await http.post(stack.mcp_url, json=listing, headers={"Mcp-Session-Id": session_id})
        assert listed.status_code == 200
    lines = await new_lines(stack, before, 2, method="tools/list")
    listed_line = next(line for line in lines if line["method"] == "tools/list")
    assert listed_line["session"] == "#" + hashlib.sha256(session_id.encode()).hexdigest()[:12]
    assert listed_line["subject"] == "bob"
    output = stack.router.output()
    assert bearer not in output and bearer.split(".")[2] not in output
    assert session_id not in output


async def test_a_refused_request_is_logged_with_its_status_and_no_subject(stack: LightStack) -> None:
    before = len(access_lines(stack))
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Authorization": "Bearer not-a-jwt", "Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        refused = await http.post(stack.mcp_url, json=body, headers=headers)
    assert refused.status_code == 401
    (line,) = await new_lines(stack, before, 1)
    assert (line["method"], line["status"], line["outcome"]) == ("tools/list", 401, "rejected")
    assert line["subject"] == "-" and line["session"] == "-"
    assert "not-a-jwt" not in stack.router.output()


async def test_library_request_chatter_stays_out_of_the_log_at_info(stack: LightStack) -> None:
    # the router called a backend above; the HTTP client's INFO line for it is not in the log
    assert access_lines(stack)
    assert "HTTP Request:" not in stack.router.output()


async def test_a_request_for_an_unknown_session_names_the_session_it_asked_for(stack: LightStack) -> None:
    headers = {
        "Authorization": f"Bearer {token('dave')}",
        "Accept": "application/json, text/event-stream",
        "Mcp-Session-Id": "no-such-session",
    }
    before = len(access_lines(stack))
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        gone = await http.post(
            stack.mcp_url, json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, headers=headers
        )
    assert gone.status_code == 404
    (line,) = await new_lines(stack, before, 1)
    assert (line["status"], line["outcome"], line["subject"]) == (404, "rejected", "dave")
    assert line["session"] == "#" + hashlib.sha256(b"no-such-session").hexdigest()[:12]
