"""Resources, resource templates, prompts and completions of the session's backends, through the router.

Real processes on loopback: server-everything over Streamable HTTP (resources, templates, prompts
and completions, some of them per session), the catalog server beside it (tools only), an indexer
in the test's loop and a router process. The SDK's own client speaks to the router, in one client
session per test.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import PromptReference, ResourceTemplateReference
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from commands.ports import free_port
from tests.support.bridges import mcp_client, needs_everything
from tests.support.everything import Everything, stack_with_everything
from tests.support.routers import LightStack, light_stack
from tests.support.waits import WAIT, wait_for

DOCUMENT = "demo://resource/static/document/architecture.md"
TEMPLATE = "demo://resource/dynamic/text/{resourceId}"
PROBING = {"health": {"interval": 0.3, "timeout": 2.0, "unhealthy_after": 1}}


@asynccontextmanager
async def router_client(stack: LightStack) -> AsyncIterator[Client]:
    """The SDK's client in one handshake session with the stack's router."""
    http = httpx2.AsyncClient(timeout=30)
    async with http, Client(streamable_http_client(stack.mcp_url, http_client=http), mode="legacy") as client:
        yield client


@asynccontextmanager
async def stack_with_two_everythings(folder: Path) -> AsyncIterator[LightStack]:
    """Two server-everything backends, alpha and beta, which offer the very same URIs and prompts."""
    alpha, beta = await asyncio.gather(
        asyncio.to_thread(Everything, free_port()), asyncio.to_thread(Everything, free_port())
    )
    try:
        backends = [{"id": "alpha", "url": alpha.url}, {"id": "beta", "url": beta.url}]
        async with light_stack(folder, backends=backends) as stack:
            yield stack
    finally:
        alpha.stop()
        beta.stop()


async def until_listed(client: Client, present: bool, within: float = WAIT) -> None:
    """Wait until the document is listed (or gone), asking the router as a client would."""
    async with asyncio.timeout(within):
        while True:
            listed = {r.uri for r in (await client.list_resources()).resources}
            if (DOCUMENT in listed) == present:
                return
            await asyncio.sleep(0.2)


def status(stack: LightStack, backend: str) -> str:
    return str(stack.indexer.registry.states[backend].status)


def texts(result: Any) -> list[str]:
    return [m.content.text for m in result.messages if getattr(m.content, "text", None)]


@needs_everything
async def test_the_router_advertises_resources_prompts_and_completions_in_its_initialize_answer(
    tmp_path: Path,
) -> None:
    async with stack_with_everything(tmp_path) as (stack, _), router_client(stack) as client:
        capabilities = client.server_capabilities
        assert capabilities.resources is not None
        assert capabilities.prompts is not None
        assert capabilities.completions is not None
        assert capabilities.tools is not None


@needs_everything
async def test_a_2026_client_without_a_session_header_lists_and_reads_resources_in_its_implied_session(
    tmp_path: Path,
) -> None:
    async with stack_with_everything(tmp_path) as (stack, _), mcp_client(stack.mcp_url) as client:
        assert client.protocol_version in MODERN_PROTOCOL_VERSIONS
        assert DOCUMENT in {r.uri for r in (await client.list_resources()).resources}
        read = await client.read_resource(DOCUMENT)
        assert "Architecture" in getattr(read.contents[0], "text", "")
        assert "simple-prompt" in {p.name for p in (await client.list_prompts()).prompts}


@needs_everything
async def test_resources_and_prompts_of_server_everything_are_listed_read_and_fetched_through_the_router(
    tmp_path: Path,
) -> None:
    async with stack_with_everything(tmp_path) as (stack, _), router_client(stack) as client:
        resources = {r.uri: r for r in (await client.list_resources()).resources}
        assert DOCUMENT in resources, sorted(resources)
        read = await client.read_resource(DOCUMENT)
        assert read.contents[0].uri == DOCUMENT
        assert "Architecture" in getattr(read.contents[0], "text", "")

        templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
        assert TEMPLATE in templates
        dynamic = await client.read_resource("demo://resource/dynamic/text/7")
        assert "7" in getattr(dynamic.contents[0], "text", "")

        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert {"simple-prompt", "args-prompt", "completable-prompt"} <= prompts
        fetched = await client.get_prompt("args-prompt", {"city": "Lisbon"})
        assert any("Lisbon" in text for text in texts(fetched)), fetched

        completed = await client.complete(
            PromptReference(type="ref/prompt", name="completable-prompt"),
            {"name": "department", "value": "Eng"},
        )
        assert "Engineering" in completed.completion.values


@needs_everything
async def test_a_resource_a_tool_call_made_in_the_session_is_listed_and_read_in_that_same_backend_session(
    tmp_path: Path,
) -> None:
    note = b"kept for the session only"
    data = "data:text/plain;base64," + base64.b64encode(note).decode()
    async with stack_with_everything(tmp_path) as (stack, _), router_client(stack) as client:
        made = await client.call_tool(
            "call_tool",
            {"tool_name": "gzip-file-as-resource", "parameters": {"name": "note.gz", "data": data}},
        )
        assert not made.is_error, made
        uri = "demo://resource/session/note.gz"
        assert uri in {r.uri for r in (await client.list_resources()).resources}
        read = await client.read_resource(uri)
        blob = getattr(read.contents[0], "blob", "")
        assert gzip.decompress(base64.b64decode(blob)) == note


@needs_everything
async def test_a_backend_that_goes_down_takes_its_resources_and_prompts_with_it_and_they_return_with_it(
    tmp_path: Path,
) -> None:
    async with (
        stack_with_everything(tmp_path, indexer=PROBING) as (stack, everything),
        router_client(stack) as client,
    ):
        await until_listed(client, present=True)
        await asyncio.to_thread(everything.stop)
        await wait_for(lambda: status(stack, "everything") == "unhealthy")
        assert DOCUMENT not in {r.uri for r in (await client.list_resources()).resources}
        assert not (await client.list_prompts()).prompts
        with pytest.raises(MCPError, match="resource not found"):
            await client.read_resource(DOCUMENT)
        # the catalog server's tools were never at stake
        assert {t.name for t in (await client.list_tools()).tools} >= {"find_tool", "call_tool"}

        await asyncio.to_thread(everything.start)
        await wait_for(lambda: status(stack, "everything") in ("healthy", "degraded"), within=2 * WAIT)
        await until_listed(client, present=True)
        assert "simple-prompt" in {p.name for p in (await client.list_prompts()).prompts}


@needs_everything
async def test_uris_and_prompt_names_two_backends_share_get_the_backend_prefix_and_forwarding_takes_it_off(
    tmp_path: Path,
) -> None:
    async with stack_with_two_everythings(tmp_path) as stack, router_client(stack) as client:
        uris = {r.uri for r in (await client.list_resources()).resources}
        assert {f"alpha_{DOCUMENT}", f"beta_{DOCUMENT}"} <= uris and DOCUMENT not in uris
        read = await client.read_resource(f"beta_{DOCUMENT}")
        assert read.contents[0].uri == f"beta_{DOCUMENT}"  # given back as the client named it
        assert "Architecture" in getattr(read.contents[0], "text", "")

        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert {f"alpha_{TEMPLATE}", f"beta_{TEMPLATE}"} <= templates
        dynamic = await client.read_resource("alpha_demo://resource/dynamic/text/3")
        assert "3" in getattr(dynamic.contents[0], "text", "")

        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert {"alpha_args-prompt", "beta_args-prompt"} <= prompts and "args-prompt" not in prompts
        fetched = await client.get_prompt("beta_args-prompt", {"city": "Porto"})
        assert any("Porto" in text for text in texts(fetched)), fetched

        completed = await client.complete(
            PromptReference(type="ref/prompt", name="alpha_completable-prompt"),
            {"name": "department", "value": "Sa"},
        )
        assert "Sales" in completed.completion.values
        by_template = await client.complete(
            ResourceTemplateReference(type="ref/resource", uri=f"beta_{TEMPLATE}"),
            {"name": "resourceId", "value": "1"},
        )
        assert by_template.completion.values == ["1"]


@needs_everything
async def test_an_unknown_uri_or_prompt_and_a_shared_bare_name_are_errors_that_say_what_to_do(
    tmp_path: Path,
) -> None:
    async with stack_with_two_everythings(tmp_path) as stack, router_client(stack) as client:
        with pytest.raises(MCPError, match=r"resource not found: demo://nowhere.*resources/list") as unknown:
            await client.read_resource("demo://nowhere")
        assert unknown.value.error.code == -32002
        with pytest.raises(MCPError, match=r"prompt not found: no-such-prompt.*prompts/list"):
            await client.get_prompt("no-such-prompt")
        with pytest.raises(MCPError, match="alpha_simple-prompt, beta_simple-prompt"):
            await client.get_prompt("simple-prompt")
