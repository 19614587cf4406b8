"""A 2026-07-28 client's `subscriptions/listen` through the router: its backends' changes reach it on
the listen's own stream, from backends of either era.

Every part in the test's process: the router, an indexer in its loop, and two backends: the asking
server (tests/support/asking_server.py: the handshake era only, a subscribable note) and the
listening server (tests/support/listening_server.py: both eras, a 2026-07-28 listen of its own; once
as a server of the 2026-07-28 era alone).
The SDK's 2026-07-28 client listens through the router; another client tells the backends to
change, directly, as anything else might.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.subscriptions import Subscription
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp_types import INVALID_PARAMS, SubscriptionFilter

from router.caller import Caller, Identity
from router.exchange import Exchange
from router.handlers.listens import MAX_BACKENDS, MAX_RESOURCES, Listens
from router.upstream.session_wide.backend_requests import Reach
from tests.support.asking_server import asking_app
from tests.support.clients import RawClient, listening, until
from tests.support.in_process import app_beside
from tests.support.listening_server import listening_app
from tests.support.routers import LightStack, light_stack
from tests.support.waits import WAIT, wait_for
from toolsearch.outgoing import OutgoingAuth
from toolsearch.sessions import Principal
from toolsearch.targets import BackendTarget, ReachableTarget, ReachableTargets

NOTE = "asking://note"


class Backends:
    """The two backends' MCP URLs, each served beside the test's loop, and the listening one's stop."""

    def __init__(self, asking: str, listening: str, listening_served: AsyncExitStack) -> None:
        self.asking_url, self.listening_url = f"{asking}/mcp/", f"{listening}/mcp"
        self._listening_served = listening_served

    async def stop_listening(self) -> None:
        """The listening server goes away."""
        await self._listening_served.aclose()


@asynccontextmanager
async def listening_stack(
    folder: Path, router: dict[str, Any] | None = None
) -> AsyncIterator[tuple[LightStack, Backends]]:
    async with AsyncExitStack() as asking_served, AsyncExitStack() as listening_served:
        asking = await asking_served.enter_async_context(app_beside(asking_app()))
        listening = await listening_served.enter_async_context(app_beside(listening_app()))
        backends = Backends(asking, listening, listening_served)
        entries = [
            {"id": "asking", "url": backends.asking_url, "timeout": 10},
            {"id": "listening", "url": backends.listening_url, "timeout": 10},
        ]
        async with light_stack(folder, router=router, backends=entries) as stack:
            yield stack, backends


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[LightStack, Backends]]:
    async with listening_stack(tmp_path) as found:
        yield found


async def touched(direct: Client) -> str:
    """What the asking server answers `touch`: how many sessions it told of the note's change."""
    return str((await direct.call_tool("touch", {})).content[0].text)  # type: ignore[union-attr]


async def next_event(subscription: Subscription) -> ServerEvent:
    async with asyncio.timeout(WAIT):
        return await anext(subscription)


async def test_a_listen_hears_a_2026_backends_resource_update_and_list_changes(
    stack: tuple[LightStack, Backends],
) -> None:
    gateway, backends = stack
    async with Client(gateway.mcp_url) as client, Client(backends.listening_url) as direct:
        wanted = {"resource_subscriptions": ["notes://a"], "resources_list_changed": True}
        async with client.listen(prompts_list_changed=True, **wanted) as subscription:  # type: ignore[arg-type]
            assert subscription.honored.resource_subscriptions == ["notes://a"]
            assert subscription.honored.resources_list_changed and subscription.honored.prompts_list_changed
            await direct.call_tool("edit", {"uri": "notes://b"})  # not named: not heard
            await direct.call_tool("edit", {"uri": "notes://a"})
            assert await next_event(subscription) == ResourceUpdated(uri="notes://a")
            await direct.call_tool("file", {})
            assert await next_event(subscription) == ResourcesListChanged()
            await direct.call_tool("reword", {})
            assert await next_event(subscription) == PromptsListChanged()


async def test_a_listen_hears_a_handshake_backends_update_in_a_session_of_its_own(
    stack: tuple[LightStack, Backends],
) -> None:
    gateway, backends = stack
    async with Client(gateway.mcp_url) as client, Client(backends.asking_url, mode="legacy") as direct:
        async with client.listen(resource_subscriptions=[NOTE]) as subscription:
            assert subscription.honored.resource_subscriptions == [NOTE]

            # acknowledged once the listen's own backend session subscribed and listens
            assert await touched(direct) == "told 1"
            assert await next_event(subscription) == ResourceUpdated(uri=NOTE)

        # the listen's end ended its backend session, and the subscription in it
        async def untold() -> bool:
            return await touched(direct) == "told 0"

        await until(untold, "the listen's backend session ended")


async def test_a_handshake_clients_standalone_stream_hears_a_2026_backends_list_changes(
    stack: tuple[LightStack, Backends],
) -> None:
    """The listening server is a 2026-07-28 backend here (discovery's era) where the client session
    keeps no session: the replica holding the client's stream listens to it instead."""
    gateway, backends = stack
    async with httpx2.AsyncClient(timeout=30) as http, Client(backends.listening_url) as direct:
        client = RawClient(http)
        await client.initialize(gateway.mcp_url)
        async with listening(http, client, gateway.mcp_url) as listener:

            def heard(method: str) -> bool:
                return any(m.get("method") == method for m in listener.messages)

            async def reworded() -> bool:  # said again until the replica's listen hears it
                await direct.call_tool("reword", {})
                return heard("notifications/prompts/list_changed")

            await until(reworded, "the prompt list change on the client's standalone stream")
            await direct.call_tool("file", {})
            await until(
                lambda: asyncio.sleep(0, heard("notifications/resources/list_changed")),
                "the resource list change on the client's standalone stream",
            )


async def test_a_subscription_at_a_backend_that_refuses_the_handshake_reaches_the_standalone_stream(
    tmp_path: Path,
) -> None:
    """A backend of the 2026-07-28 era alone keeps no subscriptions: the session keeps the client's
    in the indexer, and the replica holding its stream asks the backend with a listen."""
    async with app_beside(listening_app(modern=True)) as served:
        url = f"{served}/mcp"
        entries = [{"id": "notes", "url": url, "timeout": 10}]
        async with (
            light_stack(tmp_path, backends=entries) as gateway,
            httpx2.AsyncClient(timeout=30) as http,
            Client(url) as direct,
        ):
            client = RawClient(http)
            await client.initialize(gateway.mcp_url)
            async with listening(http, client, gateway.mcp_url) as listener:
                subscribed = await client.request(
                    gateway.mcp_url, "resources/subscribe", {"uri": "notes://a"}
                )
                complete = {"jsonrpc": "2.0", "id": 2, "result": {"resultType": "complete"}}
                assert subscribed == (200, [complete]), subscribed

                def updated(uri: str) -> bool:
                    return any(
                        m.get("method") == "notifications/resources/updated" and m["params"] == {"uri": uri}
                        for m in listener.messages
                    )

                async def edited() -> bool:  # edited again until the listen, opened anew, hears it
                    await direct.call_tool("edit", {"uri": "notes://a"})
                    return updated("notes://a")

                await until(edited, "the subscribed resource's update on the client's standalone stream")
                await direct.call_tool("edit", {"uri": "notes://b"})  # not subscribed: not heard
                status, answers = await client.request(
                    gateway.mcp_url, "resources/unsubscribe", {"uri": "notes://a"}
                )
                assert status == 200 and answers[0]["result"] == {"resultType": "complete"}, answers
            kept = [r.subscriptions for r in await gateway.indexer.sessions.records() if r.subscriptions]
            assert not kept and not updated("notes://b")


async def test_a_handshake_clients_standalone_stream_ends_whole_when_the_client_ends_its_session(
    stack: tuple[LightStack, Backends], caplog: pytest.LogCaptureFixture
) -> None:
    """The stream's part learns of the end from the indexer, inside task groups of its own: the
    stream still ends as a stream does, with no error logged."""
    gateway, _ = stack
    async with httpx2.AsyncClient(timeout=30) as http:
        client = RawClient(http)
        await client.initialize(gateway.mcp_url)
        async with listening(http, client, gateway.mcp_url) as listener:
            assert listener.status == 200
            await client.end(gateway.mcp_url)
            await wait_for(lambda: listener.ended)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_a_listen_hears_the_tool_list_change_of_a_backend_whose_tools_are_pinned(
    tmp_path: Path,
) -> None:
    async with (
        listening_stack(tmp_path, router={"pinned": ["listening/*"]}) as (gateway, backends),
        Client(gateway.mcp_url) as client,
        Client(backends.listening_url) as direct,
        client.listen(tools_list_changed=True) as subscription,
    ):
        assert subscription.honored.tools_list_changed
        await direct.call_tool("grow", {})
        assert await next_event(subscription) == ToolsListChanged()


async def test_a_resource_is_found_at_a_backend_that_offers_no_templates_beside_another(
    stack: tuple[LightStack, Backends],
) -> None:
    gateway, _ = stack
    async with Client(gateway.mcp_url) as client:
        # with two backends of resources, the router finds the URI's backend in their listings;
        # the asking server answers resources/templates/list with -32601, which lists none
        read = await client.read_resource(NOTE)
    assert [content.uri for content in read.contents] == [NOTE]


async def test_a_listen_honors_only_what_a_backend_can_deliver(stack: tuple[LightStack, Backends]) -> None:
    gateway, _ = stack
    async with (
        Client(gateway.mcp_url) as client,
        client.listen(
            tools_list_changed=True, resource_subscriptions=["nowhere://x", "notes://b"]
        ) as subscription,
    ):
        # nothing is pinned, so the client's tools never change; no backend serves nowhere://x
        assert subscription.honored.tools_list_changed is None
        assert subscription.honored.resource_subscriptions == ["notes://b"]


async def test_a_listen_naming_too_many_resources_is_refused_saying_to_split_it(
    stack: tuple[LightStack, Backends],
) -> None:
    gateway, _ = stack
    async with Client(gateway.mcp_url) as client:
        uris = [f"notes://{i}" for i in range(MAX_RESOURCES + 1)]
        with pytest.raises(MCPError) as refused:
            async with client.listen(resource_subscriptions=uris):
                pass
        assert refused.value.error.code == INVALID_PARAMS
        assert "split them" in refused.value.error.message


async def test_a_listen_ends_gracefully_when_a_backend_it_reads_goes_away(
    stack: tuple[LightStack, Backends],
) -> None:
    gateway, backends = stack
    async with (
        Client(gateway.mcp_url) as client,
        client.listen(resource_subscriptions=["notes://a"]) as subscription,
    ):
        await backends.stop_listening()
        async with asyncio.timeout(WAIT):
            heard = [event async for event in subscription]  # ends without SubscriptionLost
        assert heard == []


async def test_a_listen_ends_gracefully_when_the_router_begins_to_stop(tmp_path: Path) -> None:
    async with (
        listening_stack(tmp_path) as (gateway, _),
        Client(gateway.mcp_url) as client,
        client.listen(resource_subscriptions=["notes://a"]) as subscription,
    ):
        gateway.begin_stop()
        async with asyncio.timeout(WAIT):
            heard = [event async for event in subscription]  # ends without SubscriptionLost
        assert heard == []


def target(backend_id: str) -> BackendTarget:
    return BackendTarget(backend_id, "http://b/mcp", OutgoingAuth(), "", 5.0, 1000, None)


async def test_a_listen_over_more_backends_than_its_bound_reads_only_as_many() -> None:
    targets = tuple(
        ReachableTarget(
            BackendTarget(f"b{n:02}", "http://b/mcp", OutgoingAuth(), "", 5.0, 1000, None), prompts=True
        )
        for n in range(MAX_BACKENDS + 8)
    )
    caller = Caller(Identity(Principal(), None), "session")
    listens = Listens(None, None, None, (), asyncio.Event().wait)  # type: ignore[arg-type]
    reach = Reach(None, Exchange(caller), ReachableTargets(targets))  # type: ignore[arg-type]
    plan = await listens.plan(reach, SubscriptionFilter(prompts_list_changed=True))
    assert sorted(plan.interests) == [f"b{n:02}" for n in range(MAX_BACKENDS)]  # the first by id
    assert plan.honored.prompts_list_changed
