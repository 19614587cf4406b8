"""Containment: callers get only what their principal reaches, within limits; a stuck backend stalls no one.

One stack of real processes: the router verifies HS256 JWTs; the catalog server requires a JWT on
Cocktails and lets in only the subjects of `ALLOWED`, so Cocktails is a passthrough backend that
`bob` and the others are refused by (403). Each test uses principals of its own, since sessions
count against a principal's limit. Backends time out after 2 s (listing and calls) and
probes after 1 s. Waits are on conditions with bounded timeouts; timing claims compare the order in
which things finished, not wall-clock guesses.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import jwt
import pytest

from commands.status import fetch
from tests.support.catalogs import small_catalog
from tests.support.clients import until
from tests.support.in_process import in_process_stack
from tests.support.stack import HEADERS, INITIALIZE, Stack

WAIT = 30.0
SECRET = "containment-test-secret-long-enough-for-hs256"
ISSUER = "https://issuer.test"
PROTECTED = "Cocktails"
PROTECTED_TOOLS = {"Search_by_name", "Random_Nonalcoholic", "Search_by_ingredient"}
WEATHER = "AI_Weather_by_Meteosource"
MAX_SESSIONS = 3
MAX_ARGUMENTS = 2048
BACKEND_TIMEOUT = 2.0
ALLOWED = ("alice", "amy", "ann", "ava")  # the subjects Cocktails lets in


def mint(subject: str) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": subject, "aud": "toolsearch", "iat": now, "exp": now + 600}
    return jwt.encode(claims, SECRET, algorithm="HS256")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("containment")
    small_catalog(folder / "catalog.jsonl")
    extra = {
        "router": {
            "auth": {"mode": "jwt", "issuer": ISSUER, "audience": "toolsearch", "hs256_secret_env": "TS_JWT"},
            "max_arguments_bytes": MAX_ARGUMENTS,
        },
        "indexer": {
            "max_sessions_per_principal": MAX_SESSIONS,
            "discovery_timeout": BACKEND_TIMEOUT,
            "health": {"interval": 0.5, "timeout": 3.0, "unhealthy_after": 1},
        },
    }
    with in_process_stack(
        folder,
        catalog=folder / "catalog.jsonl",
        extra=extra,
        require_jwt=[PROTECTED],
        allowed_subjects=ALLOWED,
        env={"TOOLSEARCH_CATALOG_JWT_SECRET": SECRET, "TS_JWT": SECRET},
        backend_timeout=BACKEND_TIMEOUT,
    ) as running:
        yield running


class Caller:
    """One principal speaking raw Streamable HTTP to the router."""

    def __init__(self, stack: Stack, subject: str) -> None:
        self.url = stack.mcp_url
        self.token = mint(subject)

    async def post(self, body: dict[str, Any], session: str = "") -> httpx2.Response:
        headers = {**HEADERS, "Authorization": f"Bearer {self.token}"}
        if session:
            headers |= {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            return await http.post(self.url, json=body, headers=headers)

    async def initialize(self) -> str:
        response = await self.post(INITIALIZE)
        assert response.status_code == 200, response.text
        return str(response.headers["mcp-session-id"])

    async def tool(self, session: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        body = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }
        response = await self.post(body, session)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()["result"]
        return result

    async def names(self, session: str) -> set[str]:
        result = await self.tool(
            session, "find_tool", {"tool_description": "cocktail weather nba", "limit": 50}
        )
        return {tool["name"] for tool in result["structuredContent"]["tools"]}

    async def call(self, session: str, tool: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return await self.tool(session, "call_tool", {"tool_name": tool, "parameters": parameters})


def error_text(result: dict[str, Any]) -> str:
    assert result["isError"] is True, result
    return str(result["content"][0]["text"])


def status_of(stack: Stack, backend: str) -> str:
    (state,) = [b for b in fetch(stack.indexer_address, 5.0).backends if b.id == backend]
    return str(state.status)


async def restore(stack: Stack, backend: str) -> None:
    """End a slowdown and wait until the backend is advertised again."""
    stack.control(backend, "slow", seconds=0)
    await until(
        lambda: asyncio.to_thread(lambda: status_of(stack, backend) in ("healthy", "degraded")), "recovery"
    )


async def test_a_principal_never_sees_or_calls_a_tool_its_credentials_do_not_reach(stack: Stack) -> None:
    alice, bob = Caller(stack, "alice"), Caller(stack, "bob")
    alice_session, bob_session = await alice.initialize(), await bob.initialize()
    assert await alice.names(alice_session) >= PROTECTED_TOOLS
    assert not await bob.names(bob_session) & PROTECTED_TOOLS
    before = stack.calls(PROTECTED)
    for name in ("Search_by_name", f"{PROTECTED}_Search_by_name"):  # the plain name and the prefixed alias
        text = error_text(await bob.call(bob_session, name, {"name": "mojito"}))
        assert f"tool not found: {name}" in text
    assert stack.calls(PROTECTED) == before  # bob's attempts never left the router
    allowed = await alice.call(
        alice_session, "Search_by_name", {"name": "mojito"}
    )  # alice's session lives on
    assert allowed["structuredContent"]["arguments"] == {"name": "mojito"}
    assert stack.calls(PROTECTED) == before + 1


async def test_parameters_that_break_the_schema_never_reach_the_backend(stack: Stack) -> None:
    amy = Caller(stack, "amy")
    session = await amy.initialize()
    before = stack.calls(PROTECTED)
    for parameters in ({}, {"ingredient": 5}, {"ingredient": ["lime"]}):
        text = error_text(await amy.call(session, "Search_by_ingredient", parameters))
        assert "ingredient" in text and "invalid parameters" in text
    assert stack.calls(PROTECTED) == before
    assert not (await amy.call(session, "Search_by_ingredient", {"ingredient": "lime"}))["isError"]
    assert stack.calls(PROTECTED) == before + 1


async def test_parameters_over_the_size_limit_are_refused_naming_it(stack: Stack) -> None:
    ann = Caller(stack, "ann")
    session = await ann.initialize()
    before = stack.calls(PROTECTED)
    text = error_text(await ann.call(session, "Search_by_name", {"name": "x" * (MAX_ARGUMENTS + 1)}))
    assert "too large" in text and f"limit is {MAX_ARGUMENTS} bytes" in text
    assert stack.calls(PROTECTED) == before
    fits = await ann.call(session, "Search_by_name", {"name": "x" * (MAX_ARGUMENTS - 100)})
    assert not fits["isError"] and stack.calls(PROTECTED) == before + 1


async def test_a_principal_at_its_session_limit_gets_429_until_it_closes_one(stack: Stack) -> None:
    carol = Caller(stack, "carol")
    sessions = [await carol.initialize() for _ in range(MAX_SESSIONS)]
    refused = await carol.post(INITIALIZE)
    assert refused.status_code == 429 and "too many sessions" in refused.json()["error"]["message"]
    await Caller(stack, "dave").initialize()  # another principal is not affected
    headers = {"Authorization": f"Bearer {carol.token}", "Mcp-Session-Id": sessions[0]}
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        assert (await http.delete(stack.mcp_url, headers=headers)).status_code == 200
    await carol.initialize()
    # a burst of opens at once cannot slip past the limit between the check and the creation
    erin = Caller(stack, "erin")
    answers = await asyncio.gather(*(erin.post(INITIALIZE) for _ in range(2 * MAX_SESSIONS)))
    assert sorted(a.status_code for a in answers) == [200] * MAX_SESSIONS + [429] * MAX_SESSIONS


async def test_a_backend_hanging_at_session_open_delays_that_open_by_its_timeout_and_no_one_else(
    stack: Stack,
) -> None:
    ava, bob = Caller(stack, "ava"), Caller(stack, "bill")
    earlier, other = await ava.initialize(), await bob.initialize()
    assert await ava.names(earlier) >= PROTECTED_TOOLS
    stack.control(PROTECTED, "slow", seconds=60)
    try:
        started = time.monotonic()
        opening = asyncio.create_task(ava.initialize())  # lists Cocktails with ava's token: it hangs
        answered = 0
        while not opening.done():
            assert await bob.names(other)  # find_tool of another session, answered meanwhile
            answered += 1
        opened = await opening
        took = time.monotonic() - started
        assert answered >= 3, "other sessions were stalled while the open waited"
        assert BACKEND_TIMEOUT <= took < BACKEND_TIMEOUT + 4, took
        assert not await ava.names(opened) & PROTECTED_TOOLS  # not listed: kept, and listed once it answers
        # the probes time out too: Cocktails is dropped, and a session's earlier version no longer resolves it
        await until(
            lambda: asyncio.to_thread(lambda: status_of(stack, PROTECTED) == "unhealthy"), "unhealthy"
        )
        await until(lambda: _lacks_protected(ava, earlier), "the earlier session dropped Cocktails")
        before = stack.calls(PROTECTED)
        text = error_text(await ava.call(earlier, "Search_by_name", {"name": "mojito"}))
        assert "tool not found: Search_by_name" in text and stack.calls(PROTECTED) == before
    finally:
        await restore(stack, PROTECTED)
    # nothing was lost: once Cocktails answers, both of ava's sessions list it
    for session in (opened, earlier):
        await until(functools.partial(_has_protected, ava, session), "Cocktails listed again")


async def _lacks_protected(caller: Caller, session: str) -> bool:
    return not await caller.names(session) & PROTECTED_TOOLS


async def _has_protected(caller: Caller, session: str) -> bool:
    return await caller.names(session) >= PROTECTED_TOOLS


async def test_a_hanging_backend_stalls_no_other_sessions_calls(stack: Stack) -> None:
    alice, bob = Caller(stack, "alice"), Caller(stack, "ben")
    stuck, free = await alice.initialize(), await bob.initialize()
    finished: list[str] = []

    async def call(caller: Caller, session: str, tool: str, parameters: dict[str, Any], label: str) -> str:
        text = str((await caller.call(session, tool, parameters))["content"][0]["text"])
        finished.append(label)
        return text

    # its calls hang while its listings answer: health keeps it advertised, so the call is made
    stack.control(WEATHER, "stall", seconds=60)
    try:
        started = time.monotonic()
        hung = asyncio.create_task(call(alice, stuck, "current", {"place_id": "london"}, "hung"))
        others = [call(bob, free, "Get_All_Teams", {}, f"other{i}") for i in range(3)]
        await asyncio.gather(*others)
        text = await hung
        took = time.monotonic() - started
    finally:
        stack.control(WEATHER, "stall", seconds=0)
    assert finished[-1] == "hung"  # every other session's call finished while it hung
    assert f"did not answer within {BACKEND_TIMEOUT:g}s" in text and WEATHER in text
    assert took < 30, took  # cut at the backend's timeout, long before the 60 s stall ends
