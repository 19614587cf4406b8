"""A handshake-era backend's request of a 2026-07-28 client reaches it as an input-required round,
through any replica, and the client's answer reaches the backend; and the other way round, a
2026-07-28 backend's input-required result reaches a handshake-era client on its call's stream.

Every part in the test's process: the asking server (tests/support/asking_server.py: the handshake
era only; its tool `ask` sends `sampling/createMessage` on the call's stream and answers with what
came back), an indexer in the test's loop and two routers in front of it, replicas that share
nothing but the indexer. The SDK's 2026-07-28 client answers the round with its sampling callback,
its requests going to the two routers in turn, so the call starts on one replica and the retry
carrying the answer reaches the other; a raw client tries what the SDK would not (an altered request
state, an answer too late). The other way round, the conformance test server refusing the handshake
is the backend, and the SDK's handshake-era client answers on its call's stream, its answers
reaching either router.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import mcp_types as types
import pytest
import yaml
from mcp import Client
from mcp.client.session import ClientRequestContext, SamplingFnT
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.inbound import MCP_METHOD_HEADER, MCP_NAME_HEADER
from mcp_types import INVALID_PARAMS

from router.errors import InvalidRequest
from router.link.indexer_client import IndexerClient
from tests.support.asking import asking_replicas
from tests.support.clients import Alternating, until
from tests.support.conformance import conformance_server_in_process
from tests.support.routers import LightStack, light_stack, router_beside
from toolsearch.sessions import Principal

MODERN = "2026-07-28"
ASK = {"tool_name": "ask", "parameters": {}}
SAID = "a sampled answer"
TIMEOUT = 8  # seconds the backend's calls may take: rounds through two routers on a busy machine, with room
ANSWER = {"role": "assistant", "content": {"type": "text", "text": SAID}, "model": "m"}  # a raw client's


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[tuple[LightStack, str]]:
    async with asking_replicas(tmp_path, timeout=TIMEOUT) as found:
        yield found


async def sample(
    context: ClientRequestContext, params: types.CreateMessageRequestParams
) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=SAID), model="a model"
    )


def recording(asked: list[str]) -> SamplingFnT:
    """`sample`, each question it is asked noted in `asked`."""

    async def sample_each(
        context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        asked.append(params.messages[0].content.text)  # type: ignore[union-attr]
        return await sample(context, params)

    return sample_each


def port(url: str) -> int:
    found = urlsplit(url).port
    assert found is not None
    return found


async def call(http: httpx2.AsyncClient, url: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """call_tool of the asking server's `ask`, as a raw 2026-07-28 request that declares sampling:
    its result."""
    answer = await answer_to(http, url, extra)
    assert "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    return result


async def answer_to(
    http: httpx2.AsyncClient, url: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON-RPC answer to `call`'s request: a result or an error."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"sampling": {}},
    }
    params = {"name": "call_tool", "arguments": ASK, "_meta": meta, **(extra or {})}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        MCP_METHOD_HEADER: "tools/call",
        MCP_NAME_HEADER: "call_tool",
    }
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    response = await http.post(url, json=message, headers=headers)
    answer: dict[str, Any] = response.json()
    # a JSON-RPC error the client is to mend comes with HTTP 400, the 2026-07-28 transport's way
    assert response.status_code == (400 if "error" in answer else 200), response.text
    return answer


@asynccontextmanager
async def alternating_client(
    first: str, second: str, mode: str = "auto", sampling: SamplingFnT = sample
) -> AsyncIterator[Client]:
    """The SDK's client with `sampling` as its sampling callback, its requests sent to the two
    routers in turn (and checked, on the way out, to have reached both)."""
    alternating = Alternating([port(first), port(second)])
    async with httpx2.AsyncClient(transport=alternating, timeout=30) as http:
        transport = streamable_http_client(first, http_client=http)
        async with Client(transport, mode=mode, sampling_callback=sampling) as client:
            yield client
    assert set(alternating.used) == {port(first), port(second)}


async def test_a_backends_request_reaches_a_2026_client_as_a_round_answered_through_the_other_replica(
    replicas: tuple[LightStack, str],
) -> None:
    stack, other = replicas
    async with alternating_client(stack.mcp_url, other) as client:
        assert client.session.protocol_version == MODERN
        result = await client.call_tool("call_tool", ASK)
    text = result.content[0].text  # type: ignore[union-attr]
    assert not result.is_error and text.startswith("answered:") and SAID in text, text


async def test_a_backend_asking_during_a_read_or_a_prompt_reaches_a_2026_client_as_a_round_too(
    replicas: tuple[LightStack, str],
) -> None:
    """The asking server samples its client before it answers a read of `asking://asked` and its
    prompt `ask`: each comes to the 2026-07-28 client as an input-required round, its answer through
    the other replica, and the read's URI is the one the client named."""
    stack, other = replicas
    asked: list[str] = []
    sample_each = recording(asked)
    async with alternating_client(stack.mcp_url, other, sampling=sample_each) as client:
        read = await client.read_resource("asking://asked")
        prompt = await client.get_prompt("ask")
    assert asked == ["what to read?", "what to prompt?"]
    [contents] = read.contents
    assert str(contents.uri) == "asking://asked"
    assert contents.text.startswith("answered:") and SAID in contents.text, read  # type: ignore[union-attr]
    said = prompt.messages[0].content.text  # type: ignore[union-attr]
    assert said.startswith("answered:") and SAID in said, prompt


async def test_a_backend_that_asks_twice_asks_in_two_rounds_each_answered_on_either_replica(
    replicas: tuple[LightStack, str],
) -> None:
    stack, other = replicas
    asked: list[str] = []
    sample_each = recording(asked)
    async with alternating_client(stack.mcp_url, other, sampling=sample_each) as client:
        result = await client.call_tool("call_tool", {"tool_name": "ask_twice", "parameters": {}})
    text = result.content[0].text  # type: ignore[union-attr]
    assert asked == ["first?", "second?"]
    assert not result.is_error and text.count(SAID) == 2, text


async def test_a_round_carries_the_backends_request_as_it_came_and_the_router_s_request_state(
    replicas: tuple[LightStack, str],
) -> None:
    stack, other = replicas
    async with httpx2.AsyncClient(timeout=30) as http:
        first = await call(http, stack.mcp_url)
        assert first["resultType"] == "input_required", first
        [(key, asked)] = first["inputRequests"].items()
        assert asked["method"] == "sampling/createMessage"
        assert asked["params"]["messages"][0]["content"]["text"] == "hello?"
        assert first["requestState"].startswith("toolsearch:")
        retry = {"inputResponses": {key: ANSWER}, "requestState": first["requestState"]}
        done = await call(http, other, retry)
    assert not done.get("isError") and SAID in done["content"][0]["text"], done


async def test_an_altered_request_state_is_refused_as_invalid_params_and_reaches_no_backend(
    replicas: tuple[LightStack, str],
) -> None:
    stack, other = replicas
    async with httpx2.AsyncClient(timeout=30) as http:
        first = await call(http, stack.mcp_url)
        state = first["requestState"]
        for altered in (state[:-2] + ("AA" if not state.endswith("AA") else "BB"), f"{state}-TAMPERED"):
            refused = await answer_to(http, other, {"inputResponses": {"0": ANSWER}, "requestState": altered})
            assert refused["error"]["code"] == INVALID_PARAMS, refused
            assert "requestState names no call that waits for input" in refused["error"]["message"]
        # the real round is still open, and answered as it should be
        done = await call(http, stack.mcp_url, {"inputResponses": {"0": ANSWER}, "requestState": state})
    assert SAID in done["content"][0]["text"], done


async def test_a_retry_without_the_answer_asked_for_is_asked_it_again_under_the_same_state(
    replicas: tuple[LightStack, str],
) -> None:
    stack, other = replicas
    async with httpx2.AsyncClient(timeout=30) as http:
        first = await call(http, stack.mcp_url)
        state = first["requestState"]
        again = await call(http, other, {"inputResponses": {"wrong_key": ANSWER}, "requestState": state})
        assert again["resultType"] == "input_required", again
        assert again["inputRequests"] == first["inputRequests"] and again["requestState"] == state
        done = await call(http, stack.mcp_url, {"inputResponses": {"0": ANSWER}, "requestState": state})
    assert not done.get("isError") and SAID in done["content"][0]["text"], done


async def test_a_round_nobody_answers_ends_at_the_backends_timeout_and_says_so_to_a_late_retry(
    replicas: tuple[LightStack, str],
) -> None:
    stack, other = replicas
    async with httpx2.AsyncClient(timeout=30) as http:
        first = await call(http, stack.mcp_url)

        async def ended() -> dict[str, Any] | None:
            # a retry without the answers finds the round open until the call ends at the timeout
            late = await answer_to(http, other, {"requestState": first["requestState"]})
            if "error" in late:
                assert "carries inputResponses" in late["error"]["message"], late
                return None
            result: dict[str, Any] = late["result"]
            return result

        late = await until(ended, "the call's timeout ended the round")
    assert late.get("isError") and f"did not answer within {TIMEOUT}s" in late["content"][0]["text"], late


@pytest.mark.parametrize(
    ("token", "record", "ttl", "why"),
    [
        ("not a token!", {}, 10.0, "16 to 64 url-safe characters"),
        ("a-token-of-the-routers-own", {"big": "x" * (1 << 20)}, 10.0, "at most 1048576 bytes"),
        ("a-token-of-the-routers-own", {}, 0.0, "more than 0 and at most 3600 seconds"),
    ],
)
async def test_the_indexer_keeps_no_round_the_router_would_not_make(
    replicas: tuple[LightStack, str], token: str, record: dict[str, Any], ttl: float, why: str
) -> None:
    stack, _ = replicas
    address = yaml.safe_load(stack.config_path.read_text())["router"]["indexer"][0]
    indexer = IndexerClient([address], 10.0)
    try:
        opened = await indexer.open_session(Principal(), None)
        with pytest.raises(InvalidRequest, match=why):
            await indexer.keep_input_round(opened.session_id, Principal(), token, record, ttl)
    finally:
        await indexer.close()


@pytest.fixture
async def modern_backend(tmp_path: Path) -> AsyncIterator[tuple[LightStack, str]]:
    """A stack whose backend speaks 2026-07-28 only (the conformance test server, refusing the
    handshake), and a second router's MCP URL."""
    with conformance_server_in_process(modern_only=True) as url:
        backend = {"id": "conf", "url": url, "timeout": 10}
        async with light_stack(tmp_path, backends=[backend]) as stack, router_beside(stack) as second_url:
            yield stack, f"{second_url}/mcp"


async def test_a_2026_backends_round_reaches_a_handshake_client_on_its_stream_answered_on_another_replica(
    modern_backend: tuple[LightStack, str],
) -> None:
    stack, other = modern_backend
    async with alternating_client(stack.mcp_url, other, mode="legacy") as client:
        arguments = {"tool_name": "test_input_required_result_sampling", "parameters": {}}
        result = await client.call_tool("call_tool", arguments)
    text = result.content[0].text  # type: ignore[union-attr]
    # the backend's own answer once it had the client's, its request state back intact ("state-ok")
    assert not result.is_error and text.startswith("state-ok Hello, ") and SAID in text, text
