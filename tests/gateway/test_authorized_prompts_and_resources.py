"""Prompts, resources, templates and completions under an authorization policy: each caller lists only
what it may use, and a denied `prompts/get`, `resources/read` or completion answers exactly as an
unknown prompt or resource does.

A light stack (the indexer in the test's loop) whose router verifies HS256 tokens, in front of the
conformance test server (its prompts, resources and template) beside the catalog server's backends.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.conformance import conformance_server_in_process
from tests.support.policy_callers import ROUTER_AUTH, SECRET, SECRET_ENV, mint, policy_file
from tests.support.routers import LightStack, light_stack
from tests.support.stack import HEADERS, INITIALIZE

POLICY = """
@id("simple-prompt")
permit(principal, action == Action::"get_prompt", resource == Prompt::"test_simple_prompt");

@id("writers-prompt")
permit(
  principal in THVGroup::"writers",
  action == Action::"get_prompt",
  resource == Prompt::"test_prompt_with_arguments"
)
when { context has arg_arg1 && context.arg_arg1 == "allowed" };

@id("text-for-all")
permit(principal, action == Action::"read_resource", resource) when { resource.uri == "test://static-text" };

@id("writers-read")
permit(principal in THVGroup::"writers", action == Action::"read_resource", resource)
when { resource.uri like "test://*" };

@id("no-binary")
forbid(principal, action == Action::"read_resource", resource)
when { resource.uri == "test://static-binary" };

@id("no-secrets")
forbid(principal, action == Action::"read_resource", resource)
when { resource.uri like "test://template/secret*" };
"""
EVERY_RESOURCE = {"test://static-text", "test://static-binary", "test://watched-resource"}
TEMPLATE = "test://template/{id}/data"


class Caller:
    """One token holder in a handshake session, speaking raw JSON-RPC to the router."""

    def __init__(self, url: str, subject: str, **claims: Any) -> None:
        self.url, self.token, self.session = url, mint(subject, **claims), ""

    async def rpc(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {**HEADERS, "Authorization": f"Bearer {self.token}"}
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
        if self.session:
            headers |= {"Mcp-Session-Id": self.session, "MCP-Protocol-Version": "2025-11-25"}
        else:
            body = INITIALIZE
        async with httpx2.AsyncClient(timeout=30) as http:
            response = await http.post(self.url, json=body, headers=headers)
        assert response.status_code == 200, response.text
        if not self.session:
            self.session = str(response.headers["mcp-session-id"])
        answer: dict[str, Any] = response.json()
        return answer

    async def open(self) -> Caller:
        await self.rpc("initialize")
        return self

    async def listed(self, method: str, field: str, key: str) -> set[str]:
        answer = await self.rpc(method)
        return {str(entry[key]) for entry in answer["result"][field]}

    async def error(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        answer = await self.rpc(method, params)
        assert "error" in answer, answer
        error: dict[str, Any] = answer["error"]
        return error


def same_error(denied: dict[str, Any], unknown: dict[str, Any], names: tuple[str, str]) -> None:
    """The denied item's error is the unknown one's, its name in place of the other's."""
    assert denied["code"] == unknown["code"]
    assert denied["message"] == unknown["message"].replace(names[1], names[0])
    assert denied.get("data") == unknown.get("data")


async def denials(stack: LightStack) -> dict[tuple[str, str], float]:
    """The router's denials counter, by action and policy."""
    async with httpx2.AsyncClient(timeout=30) as http:
        text = (await http.get(f"{stack.router_url}/metrics")).text
    pattern = r'toolsearch_router_authorization_denials_total\{action="([^"]*)",policy="([^"]*)"\} (\S+)'
    return {(action, policy): float(value) for action, policy, value in re.findall(pattern, text)}


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[LightStack]:
    router = {"auth": ROUTER_AUTH}
    authorization = policy_file(tmp_path, POLICY, 0.2)
    with conformance_server_in_process() as url:
        backend = {"id": "conf", "url": url, "timeout": 10}
        async with light_stack(
            tmp_path, router=router, env={SECRET_ENV: SECRET}, authorization=authorization, backends=[backend]
        ) as running:
            yield running


async def test_each_caller_lists_only_the_prompts_resources_and_templates_it_may_use(
    stack: LightStack,
) -> None:
    guest = await Caller(stack.mcp_url, "bob").open()
    writer = await Caller(stack.mcp_url, "ann", groups=["writers"]).open()
    assert await guest.listed("prompts/list", "prompts", "name") == {"test_simple_prompt"}
    assert await writer.listed("prompts/list", "prompts", "name") == {
        "test_simple_prompt",
        "test_prompt_with_arguments",  # decided by its arguments when it is got: listed
    }
    assert await guest.listed("resources/list", "resources", "uri") == {"test://static-text"}
    assert await writer.listed("resources/list", "resources", "uri") == EVERY_RESOURCE - {
        "test://static-binary"  # a forbid overrides the group's permit
    }
    assert await guest.listed("resources/templates/list", "resourceTemplates", "uriTemplate") == set()
    assert await writer.listed("resources/templates/list", "resourceTemplates", "uriTemplate") == {TEMPLATE}


async def test_a_denied_prompt_answers_as_an_unknown_one_and_arguments_decide_a_conditional_one(
    stack: LightStack,
) -> None:
    guest = await Caller(stack.mcp_url, "bob").open()
    writer = await Caller(stack.mcp_url, "ann", groups=["writers"]).open()
    names = ("test_prompt_with_arguments", "test_prompt_without_any")
    arguments = {"arg1": "allowed", "arg2": "x"}
    denied = await guest.error("prompts/get", {"name": names[0], "arguments": arguments})
    unknown = await guest.error("prompts/get", {"name": names[1], "arguments": arguments})
    same_error(denied, unknown, names)
    got = await writer.rpc("prompts/get", {"name": names[0], "arguments": arguments})
    assert got["result"]["messages"], got
    refused = await writer.error("prompts/get", {"name": names[0], "arguments": {**arguments, "arg1": "no"}})
    same_error(refused, await writer.error("prompts/get", {"name": names[1], "arguments": {}}), names)
    # each get the policy denied is counted, by what decided: hidden from the guest, refused by its
    # arguments to the writer (no permit either time); the unknown names are not denials
    assert await denials(stack) == {("get_prompt", ""): 2.0}
    assert (await guest.rpc("prompts/get", {"name": "test_simple_prompt"}))["result"]["messages"]


async def test_a_denied_resource_answers_as_an_unknown_one_whichever_way_it_is_reached(
    stack: LightStack,
) -> None:
    guest = await Caller(stack.mcp_url, "bob").open()
    writer = await Caller(stack.mcp_url, "ann", groups=["writers"]).open()
    unknown_uri = "test://no-such-resource"
    for caller, uri in ((guest, "test://watched-resource"), (writer, "test://static-binary")):
        denied = await caller.error("resources/read", {"uri": uri})
        same_error(denied, await caller.error("resources/read", {"uri": unknown_uri}), (uri, unknown_uri))
        refused = await caller.error("resources/subscribe", {"uri": uri})
        same_error(
            refused, await caller.error("resources/subscribe", {"uri": unknown_uri}), (uri, unknown_uri)
        )
    read = await guest.rpc("resources/read", {"uri": "test://static-text"})
    assert read["result"]["contents"][0]["uri"] == "test://static-text"
    # a template the caller may see; a URI it expands to that a forbid names is read as no URI is
    public = await writer.rpc("resources/read", {"uri": "test://template/7/data"})
    assert public["result"]["contents"], public
    secret = "test://template/secret1/data"
    denied = await writer.error("resources/read", {"uri": secret})
    same_error(denied, await writer.error("resources/read", {"uri": unknown_uri}), (secret, unknown_uri))
    # a read or subscription of a hidden resource is a denial of its read: none permits the guest's,
    # a forbid the writer's; the secret URI a visible template expands to, another forbid
    assert await denials(stack) == {
        ("read_resource", ""): 2.0,
        ("read_resource", "no-binary"): 2.0,
        ("read_resource", "no-secrets"): 1.0,
    }


async def test_completions_reach_only_the_prompts_and_templates_the_caller_may_use(stack: LightStack) -> None:
    guest = await Caller(stack.mcp_url, "bob").open()
    writer = await Caller(stack.mcp_url, "ann", groups=["writers"]).open()
    argument = {"name": "arg1", "value": "a"}
    prompt = {"ref": {"type": "ref/prompt", "name": "test_prompt_with_arguments"}, "argument": argument}
    unknown = {"ref": {"type": "ref/prompt", "name": "test_prompt_elsewhere"}, "argument": argument}
    same_error(
        await guest.error("completion/complete", prompt),
        await guest.error("completion/complete", unknown),
        ("test_prompt_with_arguments", "test_prompt_elsewhere"),
    )
    assert "completion" in (await writer.rpc("completion/complete", prompt))["result"]
    template = {"ref": {"type": "ref/resource", "uri": TEMPLATE}, "argument": {"name": "id", "value": "1"}}
    other = "test://other/{id}"
    same_error(
        await guest.error("completion/complete", template),
        await guest.error("completion/complete", {**template, "ref": {"type": "ref/resource", "uri": other}}),
        (TEMPLATE, other),
    )
    assert "completion" in (await writer.rpc("completion/complete", template))["result"]
