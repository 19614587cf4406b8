"""What a client declares of itself follows its session to every replica and to its backends: the
log level it sets (`logging/setLevel`) and the capabilities it declared at initialize.

Every part in the test's process: a backend of the project's own (tests/support/asking_server.py: a
tool that logs at each level at or above the level its session set and says which that is, and one
that asks its client to sample), an indexer in the test's loop, routers in front of it, and a raw
handshake client whose session any replica serves.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx2

from tests.support.asking import asking_stack
from tests.support.clients import RawClient
from tests.support.routers import LightStack, router_beside

SEVERE = ["error", "critical", "alert", "emergency"]


def _stack(tmp_path: Path) -> AbstractAsyncContextManager[LightStack]:
    """A stack whose one extra backend is the asking server."""
    return asking_stack(tmp_path, timeout=30)


def _call(name: str) -> dict[str, Any]:
    return {"name": "call_tool", "arguments": {"tool_name": name, "parameters": {}}}


def _logged(messages: list[dict[str, Any]]) -> list[str]:
    return [m["params"]["level"] for m in messages if m.get("method") == "notifications/message"]


async def test_a_client_that_set_a_level_gets_a_plain_calls_log_messages_at_and_above_it(
    tmp_path: Path,
) -> None:
    async with _stack(tmp_path) as stack, httpx2.AsyncClient(timeout=30) as http:
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        status, answer = await client.request(stack.mcp_url, "logging/setLevel", {"level": "warning"})
        assert (status, answer[0].get("result")) == (200, {}), answer
        # no progress token: the log messages alone make the answer a stream
        status, messages = await client.request(stack.mcp_url, "tools/call", _call("chatter"))
    assert status == 200
    assert _logged(messages) == ["warning", *SEVERE]
    # the backend session, opened after the level was set, was told it at once
    assert messages[-1]["result"]["content"][0]["text"] == "level: warning", messages


async def test_a_level_set_through_one_replica_reaches_the_backend_session_another_opened(
    tmp_path: Path,
) -> None:
    async with (
        _stack(tmp_path) as stack,
        router_beside(stack) as other_url,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        other = f"{other_url}/mcp"
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        _, before = await client.request(stack.mcp_url, "tools/call", _call("chatter"))
        status, answer = await client.request(other, "logging/setLevel", {"level": "error"})
        assert (status, answer[0].get("result")) == (200, {}), answer
        _, after = await client.request(stack.mcp_url, "tools/call", _call("chatter"))
    # before any level, a plain call is answered with plain JSON: its log messages have no room
    assert len(before) == 1 and before[0]["result"]["content"][0]["text"] == "level: unset", before
    assert after[-1]["result"]["content"][0]["text"] == "level: error", after
    assert _logged(after) == SEVERE


async def test_a_backend_asking_for_a_capability_the_client_did_not_declare_gets_the_client_minus_32021(
    tmp_path: Path,
) -> None:
    async with _stack(tmp_path) as stack, httpx2.AsyncClient(timeout=30) as http:
        client = RawClient(http)
        await client.initialize(stack.mcp_url, {"roots": {}})
        async with asyncio.timeout(20):  # the backend waits 60 s for an answer it is never given
            status, answer = await client.request(stack.mcp_url, "tools/call", _call("ask"))
    error = answer[-1]["error"]
    assert (status, error["code"]) == (200, -32021), answer
    assert error["data"] == {"requiredCapabilities": {"sampling": {}}}
    assert "sampling capability, which the client did not declare" in error["message"]
