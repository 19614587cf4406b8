"""What a backend streams during a call reaches the client (progress, on the call's own stream), and
the client's cancellation reaches the backend, whichever router replica it is sent to.

Real processes on loopback: server-everything over Streamable HTTP (its long-running operation
reports progress at each step when the caller gives a progress token) or a small stdio server behind
the bridge (a tool that never answers, and one that lists the cancellations it was sent), an indexer
in the test's loop and router processes, and the SDK's client in both protocol eras (and the
TypeScript SDK's, tests/servers/resuming-client.mjs, resuming a call's stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from commands.ports import free_port
from tests.support.bridges import fake, mcp_client, needs_everything, running_bridge
from tests.support.clients import RawClient
from tests.support.everything import stack_with_everything
from tests.support.routers import another_router, light_stack
from tests.support.split_proxy import split_proxy
from tests.support.stack import HEADERS, INITIALIZE
from tests.support.waits import wait_for

LONG = "trigger-long-running-operation"
RESUMING_CLIENT = Path(__file__).parents[1] / "servers" / "resuming-client.mjs"


@needs_everything
@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["handshake client", "2026-07-28 client"])
async def test_progress_notifications_of_a_backend_reach_the_client_before_the_result(
    tmp_path: Path, mode: str
) -> None:
    async with stack_with_everything(tmp_path) as (stack, _):
        reports: list[tuple[float, float | None]] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            reports.append((value, total))

        async with mcp_client(stack.mcp_url, mode=mode) as client:
            result = await client.call_tool(
                "call_tool",
                {"tool_name": LONG, "parameters": {"duration": 0.4, "steps": 4}},
                progress_callback=progress,
            )
        assert not result.is_error, result
        assert "Long running operation completed" in result.content[0].text
        assert reports == [(1.0, 4.0), (2.0, 4.0), (3.0, 4.0), (4.0, 4.0)]


async def python_call(url: str, parameters: dict[str, Any]) -> tuple[bool, str, list[float]]:
    """LONG called through call_tool by the Python SDK's handshake-era client with a progress
    callback: whether it failed, its text, and the progress reports."""
    reports: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        reports.append(value)

    async with mcp_client(url, mode="legacy") as client:
        result = await client.call_tool(
            "call_tool", {"tool_name": LONG, "parameters": parameters}, progress_callback=progress
        )
    return result.is_error, str(getattr(result.content[0], "text", "")), reports


async def typescript_call(url: str, parameters: dict[str, Any]) -> tuple[bool, str, list[float]]:
    """The same through the TypeScript SDK's client (tests/servers/resuming-client.mjs)."""
    done = await asyncio.to_thread(
        subprocess.run,
        ["node", str(RESUMING_CLIENT), url, LONG, json.dumps(parameters)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    result = answer["result"]
    return bool(result.get("isError")), result["content"][0]["text"], answer["progress"]


@needs_everything
@pytest.mark.parametrize(
    "call", [python_call, typescript_call], ids=["Python SDK client", "TypeScript SDK client"]
)
async def test_a_client_whose_call_stream_drops_resumes_it_on_another_replica_and_misses_nothing(
    tmp_path: Path, call: Callable[[str, dict[str, Any]], Awaitable[tuple[bool, str, list[float]]]]
) -> None:
    """The connection to the replica running the call drops after two progress reports; the SDK's
    client resumes the stream with `Last-Event-ID`, the other replica reads the rest from the
    indexer and follows it, and the client gets every report once, in order, and the result."""
    async with stack_with_everything(tmp_path) as (stack, _):
        second, second_url = await asyncio.to_thread(another_router, stack, "second", {})
        try:
            with split_proxy(stack.router_url, second_url, free_port(), cut_after=2) as (url, proxy):
                failed, text, reports = await call(f"{url}/mcp", {"duration": 2.0, "steps": 8})
        finally:
            second.stop()
    assert not failed, text
    assert "Long running operation completed" in text
    assert reports == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert (proxy.cuts, proxy.resumptions) == (1, 1)


@needs_everything
async def test_a_call_without_a_progress_token_is_answered_with_plain_json(tmp_path: Path) -> None:
    async with stack_with_everything(tmp_path) as (stack, _), httpx2.AsyncClient(timeout=30) as http:
        opened = await http.post(stack.mcp_url, json=INITIALIZE, headers=HEADERS)
        headers = {**HEADERS, "Mcp-Session-Id": opened.headers["mcp-session-id"]}
        params = {"name": "call_tool", "arguments": {"tool_name": LONG, "parameters": {"duration": 0.1}}}
        message = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
        response = await http.post(stack.mcp_url, json=message, headers=headers)
        assert response.headers["content-type"].startswith("application/json")
        assert "Long running operation completed" in response.json()["result"]["content"][0]["text"]


async def test_a_cancellation_sent_to_another_replica_reaches_the_backend_and_ends_the_call(
    tmp_path: Path,
) -> None:
    with running_bridge(tmp_path, [fake("patient", id="patient")]) as bridge:
        backend = {"id": "patient", "url": bridge.mcp_url("patient"), "timeout": 60}
        async with light_stack(tmp_path, backends=[backend]) as stack:
            second, second_url = await asyncio.to_thread(another_router, stack, "second", {})
            try:
                async with httpx2.AsyncClient(timeout=90) as http:
                    client = RawClient(http)
                    await client.initialize(stack.mcp_url)
                    # the session's backend session is opened by a first call
                    assert not (await client.call(stack.mcp_url, "echo", {"text": "hi"})).get("isError")
                    waiting_id = client.next_id()
                    waiting = asyncio.create_task(client.call(stack.mcp_url, "wait", {}, waiting_id))
                    cancel = {"requestId": waiting_id, "reason": "the user gave up"}

                    def ended() -> bool:
                        return waiting.done()

                    async def cancel_until_ended() -> None:
                        # the call may not have reached the backend yet: a cancellation of a request
                        # the backend does not know is ignored, so it is sent again until one lands
                        while not ended():
                            await client.notify(f"{second_url}/mcp", "notifications/cancelled", cancel)
                            with contextlib.suppress(TimeoutError):
                                await wait_for(ended, within=0.5)

                    async with asyncio.timeout(20):  # far less than the backend's 60 s timeout
                        await asyncio.gather(cancel_until_ended(), waiting)
                    seen = await client.call(stack.mcp_url, "cancelled", {})
            finally:
                second.stop()
    assert waiting.result().get("isError"), waiting.result()
    assert len(json.loads(seen["content"][0]["text"])) >= 1  # the stdio server was told too, by the bridge


async def test_cancelling_a_sessions_first_call_to_a_backend_reaches_it_through_another_replica(
    tmp_path: Path,
) -> None:
    with running_bridge(tmp_path, [fake("patient", id="patient")]) as bridge:
        backend = {"id": "patient", "url": bridge.mcp_url("patient"), "timeout": 60}
        async with light_stack(tmp_path, backends=[backend]) as stack:
            second, second_url = await asyncio.to_thread(another_router, stack, "second", {})
            try:
                async with httpx2.AsyncClient(timeout=90) as http:
                    client = RawClient(http)
                    await client.initialize(stack.mcp_url)
                    # the session's first call to the backend: it opens the backend session
                    waiting_id = client.next_id()
                    waiting = asyncio.create_task(client.call(stack.mcp_url, "wait", {}, waiting_id))
                    cancel = {"requestId": waiting_id, "reason": "the user gave up"}

                    async def cancel_until_ended() -> None:
                        # sent again until it lands: the call may not have reached the backend yet
                        while not waiting.done():
                            await client.notify(f"{second_url}/mcp", "notifications/cancelled", cancel)
                            with contextlib.suppress(TimeoutError):
                                await wait_for(waiting.done, within=0.5)

                    async with asyncio.timeout(20):  # far less than the backend's 60 s timeout
                        await asyncio.gather(cancel_until_ended(), waiting)
                    seen = await client.call(stack.mcp_url, "cancelled", {})
            finally:
                second.stop()
    assert waiting.result().get("isError"), waiting.result()
    assert len(json.loads(seen["content"][0]["text"])) >= 1  # the stdio server was told, by the bridge


async def test_cancelling_a_slow_first_call_ends_it_at_once_on_the_replica_running_it(tmp_path: Path) -> None:
    # the catalog server speaks 2026-07-28: each call is a request of its own, with no backend
    # session to pass a cancellation on in; the router running the call ends it itself
    async with light_stack(tmp_path) as stack, httpx2.AsyncClient(timeout=90) as http:
        control = f"{stack.catalog_url}/control/servers/Cocktails"
        (await http.post(f"{control}/stall", params={"seconds": 120})).raise_for_status()
        try:
            client = RawClient(http)
            await client.initialize(stack.mcp_url)
            before = (await http.get(f"{control}/calls")).json()["requests"]
            call_id = client.next_id()
            call = asyncio.create_task(client.call(stack.mcp_url, "Search_by_name", {"name": "x"}, call_id))

            def arrived() -> bool:
                return bool(httpx2.get(f"{control}/calls", timeout=5).json()["requests"] > before)

            await asyncio.to_thread(lambda: asyncio.run(wait_for(arrived)))
            await client.notify(
                stack.mcp_url, "notifications/cancelled", {"requestId": call_id, "reason": "no longer needed"}
            )
            async with asyncio.timeout(30):  # far less than the 120 s stall
                result = await call
        finally:
            (await http.post(f"{control}/stall", params={"seconds": 0})).raise_for_status()
    assert result.get("isError"), result
    assert result["content"][0]["text"] == (
        "backend Cocktails did not finish the call: the client cancelled it: no longer needed"
    ), result
