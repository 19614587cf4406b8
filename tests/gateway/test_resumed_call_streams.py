"""A call's stream resumed with `Last-Event-ID`: what comes back when the stream is whole, still
being written, cut short, or gone (docs/gateway.md, "Streams a client resumes").

The router in the test's process, the indexer in the test's loop, and a raw client. The kept
stream is written here through the router's own indexer link, as the replica running a call writes
it, so the test decides what that replica did: answered, kept writing, stopped without an answer,
or died (its record not renewed).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from router.caller import Caller, Identity
from router.frontdoor.streams.stream_log import RETRY_MS, Detached, StreamLog
from router.link.indexer_client import IndexerClient
from tests.support.routers import LightStack, light_stack
from tests.support.stack import HEADERS, INITIALIZE
from toolsearch.kept_streams import EventsToKeep, StreamEnd
from toolsearch.sessions import Principal

STREAM = "a-stream-kept-for-resumption"
PROGRESS = {
    "jsonrpc": "2.0",
    "method": "notifications/progress",
    "params": {"progressToken": 1, "progress": 1},
}
ANSWER = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "done"}]}}


def event(number: int, message: dict[str, Any]) -> str:
    return f"id: {STREAM}/{number}\r\nevent: message\r\ndata: {json.dumps(message)}\r\n\r\n"


def messages(body: str) -> list[tuple[str, dict[str, Any]]]:
    """The (id, message) of each event of an SSE body."""
    found = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != ":")
        if "data" in fields:
            found.append((fields.get("id", ""), json.loads(fields["data"])))
    return found


class Resuming:
    """A session at the router, and the indexer link its kept streams are written through."""

    def __init__(
        self, stack: LightStack, http: httpx2.AsyncClient, indexer: IndexerClient, session: str
    ) -> None:
        self.stack, self.http, self.indexer, self.session = stack, http, indexer, session

    async def keep(
        self, first: int, *events: str, end: StreamEnd = StreamEnd.OPEN, ttl: float = 30.0
    ) -> None:
        keep = EventsToKeep(self.session, STREAM, first, events, end, ttl, "7")
        await self.indexer.keep_stream_events(Principal(), keep)

    async def resume(self, last_event_id: str) -> httpx2.Response:
        headers = {**HEADERS, "Mcp-Session-Id": self.session, "Last-Event-ID": last_event_id}
        return await self.http.get(self.stack.mcp_url, headers=headers)


@pytest.fixture
async def resuming(tmp_path: Path) -> AsyncIterator[Resuming]:
    async with light_stack(tmp_path) as stack, httpx2.AsyncClient(timeout=30) as http:
        address = yaml.safe_load(stack.config_path.read_text())["router"]["indexer"][0]
        indexer = IndexerClient([address], 10.0)
        try:
            opened = await http.post(stack.mcp_url, json=INITIALIZE, headers=HEADERS)
            yield Resuming(stack, http, indexer, opened.headers["mcp-session-id"])
        finally:
            await indexer.close()


async def test_a_resumed_stream_replays_what_came_after_the_last_id_and_follows_it_to_the_answer(
    resuming: Resuming,
) -> None:
    await resuming.keep(1, event(1, PROGRESS), event(2, PROGRESS))
    resumed = asyncio.create_task(resuming.resume(f"{STREAM}/1"))
    await asyncio.sleep(0.3)  # the resumption reads what is kept, then follows the stream
    await resuming.keep(3, event(3, PROGRESS), event(4, ANSWER), end=StreamEnd.DONE)
    response = await asyncio.wait_for(resumed, 20)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert messages(response.text) == [
        (f"{STREAM}/2", PROGRESS),
        (f"{STREAM}/3", PROGRESS),
        (f"{STREAM}/4", ANSWER),
    ]


async def test_a_stream_that_ended_without_its_answer_is_answered_with_an_error(resuming: Resuming) -> None:
    await resuming.keep(1, event(1, PROGRESS), end=StreamEnd.DONE)
    response = await resuming.resume(f"{STREAM}/0")
    (_, progress), (_, error) = messages(response.text)
    assert progress == PROGRESS
    assert error["id"] == 7
    assert error["error"]["message"] == "the call's stream ended before its answer: call again"


async def test_a_stream_whose_replica_stopped_renewing_it_ends_with_an_error_not_a_wait(
    resuming: Resuming,
) -> None:
    await resuming.keep(1, event(1, PROGRESS), ttl=1.0)  # and never again: that replica is gone
    response = await asyncio.wait_for(resuming.resume(f"{STREAM}/0"), 20)
    (_, progress), (_, error) = messages(response.text)
    assert progress == PROGRESS
    assert error == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {
            "code": -32603,
            "message": "the router running this call stopped before its answer: call again",
        },
    }


async def test_a_stream_whose_events_could_not_all_be_kept_says_so(resuming: Resuming) -> None:
    await resuming.keep(1, event(1, PROGRESS))
    await resuming.keep(2, end=StreamEnd.BROKEN)
    response = await resuming.resume(f"{STREAM}/0")
    assert [m.get("error", {}).get("message") for _, m in messages(response.text)] == [
        None,
        "some of the call's events could not be kept for resumption: call again",
    ]


@pytest.mark.parametrize("last_event_id", [f"{STREAM}/0", "not-an-id-of-ours", f"{'x' * 20}/3"])
async def test_an_id_of_no_stream_kept_in_the_session_is_refused_saying_why(
    resuming: Resuming, last_event_id: str
) -> None:
    response = await resuming.resume(last_event_id)  # nothing kept at all
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith(f"Last-Event-ID {last_event_id!r} names no call stream kept in this session")


async def test_a_stream_of_another_session_is_not_found_in_this_one(resuming: Resuming) -> None:
    other = await resuming.http.post(resuming.stack.mcp_url, json=INITIALIZE, headers=HEADERS)
    keep = EventsToKeep(
        other.headers["mcp-session-id"], STREAM, 1, [event(1, ANSWER)], StreamEnd.DONE, 30, "7"
    )
    await resuming.indexer.keep_stream_events(Principal(), keep)
    assert (await resuming.resume(f"{STREAM}/0")).status_code == 400


async def test_a_streamed_call_opens_with_a_priming_event_and_numbers_every_event(resuming: Resuming) -> None:
    """What the client resumes from: an id on each event, the first one with no message, and the
    `retry` the client waits before it resumes."""
    headers = {**HEADERS, "Mcp-Session-Id": resuming.session, "MCP-Protocol-Version": "2025-11-25"}
    params = {"name": "find_tool", "arguments": {"query": "weather"}, "_meta": {"progressToken": 5}}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
    response = await resuming.http.post(resuming.stack.mcp_url, json=call, headers=headers)
    assert response.headers["content-type"].startswith("text/event-stream")
    first, _, rest = response.text.replace("\r\n", "\n").partition("\n\n")
    stream_id = first.splitlines()[0].removeprefix("id: ").removesuffix("/0")
    assert first.splitlines() == [f"id: {stream_id}/0", f"retry: {RETRY_MS}", "data: "]
    numbered = messages(rest)
    assert [event_id for event_id, _ in numbered] == [f"{stream_id}/{n}" for n in range(1, len(numbered) + 1)]
    assert numbered[-1][1]["id"] == 2
    # and the stream is kept: resumed from its start, it is the same
    again = await resuming.resume(f"{stream_id}/0")
    assert messages(again.text) == numbered


async def test_a_replica_runs_on_at_most_its_bound_of_calls_whose_clients_went_away(
    resuming: Resuming,
) -> None:
    detached = Detached(limit=1)
    caller = Caller(Identity(Principal(), None), resuming.session)
    first, second, third = (StreamLog(resuming.indexer, caller, "1", detached) for _ in range(3))
    assert first.run_on()
    assert not second.run_on()  # the second call ends with its client, as an unkept one does
    first.close()
    first.close()  # closed again by the session layer: counted out once
    assert detached.count == 0
    third.close()
    assert third.run_on()  # a client that leaves after its stream ended holds nothing
    assert (detached.count, detached.refused) == (0, 1)


async def test_a_stream_longer_than_one_read_is_replayed_whole_in_order(resuming: Resuming) -> None:
    many = [event(n, {**PROGRESS, "params": {"progressToken": 1, "progress": n}}) for n in range(1, 251)]
    await resuming.keep(1, *many)
    resumed = asyncio.create_task(resuming.resume(f"{STREAM}/0"))
    await asyncio.sleep(0.3)  # it reads what is kept, more than one read's worth, then follows
    await resuming.keep(251, event(251, ANSWER), end=StreamEnd.DONE)
    response = await asyncio.wait_for(resumed, 20)
    numbered = messages(response.text)
    assert [event_id for event_id, _ in numbered] == [f"{STREAM}/{n}" for n in range(1, 252)]
    assert numbered[-1][1] == ANSWER
