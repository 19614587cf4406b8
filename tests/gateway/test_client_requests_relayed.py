"""A backend's requests of its client during a call (sampling, elicitation, roots) reach the client on
the call's stream, and the client's answer, posted to whichever router replica, reaches the backend.

Every part in the test's process: a handshake-era server that asks its client to sample during a
call (tests/support/asking_server.py), an indexer in the test's loop, two routers in front of it, and
a raw JSON-RPC client that reads the call's stream and posts each answer to the other replica. The
conformance suite (tests/system/test_conformance.py) runs the same relay with the suite's own client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.asking import asking_replicas
from tests.support.clients import RawClient, until
from tests.support.routers import LightStack

SAMPLED = {"role": "assistant", "content": {"type": "text", "text": "a haiku"}, "model": "the client's"}


@pytest.fixture
async def asking(tmp_path: Path) -> AsyncIterator[tuple[LightStack, str]]:
    """A stack whose one backend asks its client to sample (timeout 5 s), and a second router's URL."""
    async with asking_replicas(tmp_path, timeout=5) as replicas:
        yield replicas


async def sampled(
    asking: tuple[LightStack, str], method: str, params: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`method` sent to the first router by a client that declared sampling, its answer to each
    request of the backend posted to the other replica: the result, and the requests."""
    stack, other = asking
    async with httpx2.AsyncClient(timeout=30) as http:
        client = RawClient(http)
        await client.initialize(stack.mcp_url, {"sampling": {}})
        async with asyncio.timeout(20):
            return await client.request_answering(stack.mcp_url, method, params, other, lambda _: SAMPLED)


async def test_a_backends_sampling_request_reaches_the_client_and_the_answer_via_another_replica_reaches_it(
    asking: tuple[LightStack, str],
) -> None:
    params = {"name": "call_tool", "arguments": {"tool_name": "ask", "parameters": {}}}
    result, asked = await sampled(asking, "tools/call", params)
    assert [r["method"] for r in asked] == ["sampling/createMessage"]
    assert asked[0]["params"]["messages"][0]["content"]["text"] == "hello?"  # as the backend asked it
    text = result["content"][0]["text"]
    assert text.startswith("answered: ") and "a haiku" in text and "the client's" in text, result


@pytest.mark.parametrize(
    ("method", "params"),
    [("resources/read", {"uri": "asking://asked"}), ("prompts/get", {"name": "ask"})],
    ids=["a resource read", "a prompt"],
)
async def test_a_backend_asking_its_client_during_a_read_or_a_prompt_gets_the_answer_via_another_replica(
    asking: tuple[LightStack, str], method: str, params: dict[str, Any]
) -> None:
    result, asked = await sampled(asking, method, params)
    assert [r["method"] for r in asked] == ["sampling/createMessage"]
    said = (
        result["contents"][0]["text"]
        if method == "resources/read"
        else result["messages"][0]["content"]["text"]
    )
    assert said.startswith("answered: ") and "a haiku" in said, result


async def test_a_request_the_client_never_answers_ends_the_call_at_its_timeout_and_holds_nothing(
    asking: tuple[LightStack, str],
) -> None:
    stack, other = asking
    async with httpx2.AsyncClient(timeout=30) as http:
        client = RawClient(http)
        await client.initialize(stack.mcp_url, {"sampling": {}})
        async with asyncio.timeout(20):  # the backend's timeout is 5 s, its own wait 60 s
            unanswered, _ = await client.call_answering(stack.mcp_url, "ask", {}, other, lambda _: None)

            async def told() -> str:
                text: str = (await client.call(other, "last", {}))["content"][0]["text"]
                return text if text != "none yet" else ""

            backend_saw = await until(told, "the backend's ask to end")
            answered, _ = await client.call_answering(stack.mcp_url, "ask", {}, other, lambda _: SAMPLED)
    assert unanswered.get("isError"), unanswered
    assert unanswered["content"][0]["text"] == "backend asking did not answer within 5s", unanswered
    # the backend was told that its request goes unanswered, not left to its own 60 s wait
    assert backend_saw == "refused: the call ended before the client answered this request"
    assert "a haiku" in answered["content"][0]["text"], answered  # the session goes on


async def test_an_answer_that_names_no_backend_of_the_session_is_refused_with_what_to_do(
    asking: tuple[LightStack, str],
) -> None:
    stack, _ = asking
    async with httpx2.AsyncClient(timeout=30) as http:
        client = RawClient(http)
        await client.initialize(stack.mcp_url, {"sampling": {}})
        forged: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": 'toolsearch/relayed:["asking",0]',
            "result": SAMPLED,
        }
        response = await http.post(stack.mcp_url, json=forged, headers=client.headers())
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == (
        "no request of backend asking waits for an answer in this session: answer only the requests "
        "this session's calls passed on, while their calls run"
    )


async def test_a_clients_roots_change_sent_to_another_replica_reaches_its_backend_session(
    asking: tuple[LightStack, str],
) -> None:
    stack, other = asking
    async with httpx2.AsyncClient(timeout=30) as http:
        client = RawClient(http)
        await client.initialize(stack.mcp_url, {"roots": {"listChanged": True}})
        before = await client.call(stack.mcp_url, "roots", {})  # opens the backend session
        await client.notify(other, "notifications/roots/list_changed", {})
        after = await client.call(stack.mcp_url, "roots", {})
    assert before["content"][0]["text"] == "roots changed 0"
    assert after["content"][0]["text"] == "roots changed 1"


async def test_an_answer_posted_in_another_session_never_reaches_the_request_it_names(
    asking: tuple[LightStack, str],
) -> None:
    stack, other = asking
    forged_result = {**SAMPLED, "content": {"type": "text", "text": "forged"}}
    forged_status: list[int] = []
    async with httpx2.AsyncClient(timeout=30) as http:
        alice, mallory = RawClient(http), RawClient(http)
        await alice.initialize(stack.mcp_url, {"sampling": {}})
        await mallory.initialize(stack.mcp_url, {"sampling": {}})
        await mallory.call(other, "roots", {})  # mallory keeps a backend session there too

        async def answer(request: dict[str, Any]) -> dict[str, Any]:
            # mallory posts an answer under alice's request's id, in its own session, first
            forged = {"jsonrpc": "2.0", "id": request["id"], "result": forged_result}
            forged_status.append((await http.post(other, json=forged, headers=mallory.headers())).status_code)
            return SAMPLED

        async with asyncio.timeout(20):
            result, _ = await alice.call_answering(stack.mcp_url, "ask", {}, other, answer)
    # taken into mallory's own backend session, where no such request waits: the backend drops it
    assert forged_status == [202]
    text = result["content"][0]["text"]
    assert "a haiku" in text and "forged" not in text, result
