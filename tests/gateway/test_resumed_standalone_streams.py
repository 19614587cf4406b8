"""A handshake-era client's standalone stream resumed with `Last-Event-ID`, on any router.

The router keeps nothing of it: each event's id is a cursor of where the stream got to at each
backend (router/frontdoor/streams/stream_cursor.py), and the backend, a server with an event store,
replays what came after. The asking server (tests/support/asking_server.py, an event store of its
own) is the backend, behind a light stack and a second router in the test's process; its `touch`
sends each subscribed session an update of its note and a log line on that session's stream.
"""

from __future__ import annotations

import base64
import functools
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
import yaml
from mcp import Client

from commands.ports import free_port
from router.frontdoor.streams.stream_cursor import MAX_BACKENDS, MAX_MARK, StreamCursor, is_cursor
from tests.support.asking import asking_stack
from tests.support.clients import Listener, RawClient, listening, until
from tests.support.in_process import hosted_beside, serve_router
from tests.support.routers import LightStack
from tests.support.waits import wait_for
from toolsearch.config import load_config

NOTE = "asking://note"
UPDATED, LOGGED = "notifications/resources/updated", "notifications/message"


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[LightStack]:
    async with asking_stack(tmp_path, timeout=10) as found:
        yield found


def asking_url(stack: LightStack) -> str:
    (backend,) = yaml.safe_load(stack.config_path.read_text())["backends"]
    return str(backend["url"])


def note_events(listener: Listener) -> list[str]:
    """What the asking server's `touch` sent, as the stream carried it: an update, then a log line."""
    return [str(m["method"]) for m in listener.messages if m.get("method") in (UPDATED, LOGGED)]


async def touched(direct: Client) -> str:
    return str((await direct.call_tool("touch", {})).content[0].text)  # type: ignore[union-attr]


async def test_a_standalone_stream_resumed_on_another_router_gets_what_its_backend_sent_meanwhile(
    stack: LightStack,
) -> None:
    """The client resumes its standalone stream with the last id it read, on a second router, and
    gets what was sent while it was away, once, and what comes next."""
    port = free_port()
    second = functools.partial(
        serve_router, load_config(stack.config_path), f"127.0.0.1:{port}", dict(os.environ)
    )
    async with (
        hosted_beside(second),
        httpx2.AsyncClient(timeout=30) as http,
        Client(asking_url(stack), mode="legacy") as direct,
    ):
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        status, _ = await client.request(stack.mcp_url, "resources/subscribe", {"uri": NOTE})
        assert status == 200
        async with listening(http, client, stack.mcp_url) as first:

            async def heard() -> bool:  # touched again until the stream, opened meanwhile, hears it
                assert await touched(direct) == "told 1"
                return bool(note_events(first))

            await until(heard, "the note's update on the client's standalone stream")
            await wait_for(lambda: len(note_events(first)) % 2 == 0)  # each touch's log line too
            left_at = first.last_id
        assert is_cursor(left_at), left_at

        # away: two touches, which the backend keeps for its session's stream
        assert await touched(direct) == "told 1"
        assert await touched(direct) == "told 1"
        elsewhere = f"http://127.0.0.1:{port}/mcp"
        async with listening(http, client, elsewhere, last_event_id=left_at) as resumed:
            await wait_for(lambda: len(note_events(resumed)) >= 4)
            assert resumed.status == 200
            assert await touched(direct) == "told 1"  # and what comes next, after them
            await wait_for(lambda: len(note_events(resumed)) >= 6)
            assert note_events(resumed) == [UPDATED, LOGGED] * 3  # nothing of before, nothing twice
            assert resumed.last_id != left_at and is_cursor(resumed.last_id)


async def test_a_standalone_stream_resumed_from_an_id_of_no_such_stream_is_refused_saying_so(
    stack: LightStack,
) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        headers = {**client.headers(), "Accept": "text/event-stream", "Last-Event-ID": "at1.not-json"}
        response = await http.get(stack.mcp_url, headers=headers)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "not an event id of a standalone stream" in message and "without it" in message, message


def test_a_cursor_carries_each_backends_last_mark_through_its_event_id() -> None:
    cursor = StreamCursor()
    assert cursor.event_id() == ""  # no backend's events had ids: the events carry none
    cursor.moved("a", "tag1 _GET_stream/3")
    cursor.moved("b", "")  # an event without an id moves nothing
    cursor.moved("a", "tag1 _GET_stream/5")
    event_id = cursor.event_id()
    assert is_cursor(event_id) and not is_cursor("Zm9vYmFyYmF6cXV4cXV1eA/3")  # a call stream's id
    assert StreamCursor.parse(event_id).marks == {"a": "tag1 _GET_stream/5"}


def test_a_cursor_follows_at_most_its_bound_of_backends_and_short_marks() -> None:
    cursor = StreamCursor()
    for number in range(MAX_BACKENDS + 1):
        cursor.moved(f"backend{number}", "t 1")
    cursor.moved("backend0", "t " + "x" * MAX_MARK)  # too long: the last short one stays
    assert len(cursor.marks) == MAX_BACKENDS and cursor.marks["backend0"] == "t 1"
    assert f"backend{MAX_BACKENDS}" not in StreamCursor.parse(cursor.event_id()).marks


@pytest.mark.parametrize(
    ("event_id", "said"),
    [
        ("at1.%%%", "not base64url JSON"),
        ("at1." + "W10", "at most"),  # a list, not an object
        ("at1." + base64.urlsafe_b64encode(json.dumps({"a": 1}).encode()).decode(), "not a short string"),
    ],
)
def test_a_malformed_cursor_says_what_is_wrong_with_it(event_id: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        StreamCursor.parse(event_id)
