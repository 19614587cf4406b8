"""A handshake-era client's standalone stream resumed with `Last-Event-ID`, on any router, and the
backends' standalone streams read from where they got to.

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
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from mcp import Client

from commands.ports import free_port
from router.frontdoor.streams import stream_cursor
from router.frontdoor.streams.stream_cursor import MAX_BACKENDS, MAX_MARK, StreamCursor, is_cursor
from router.upstream.session_wide.backend_streams import mark, read_standalone, resumed_from
from router.upstream.wire.backend_answers import StreamPosition
from tests.support.asking import asking_stack
from tests.support.clients import Listener, RawClient, listening, until
from tests.support.in_process import hosted_beside, serve_router
from tests.support.routers import LightStack
from tests.support.waits import wait_for
from toolsearch.config import load_config
from toolsearch.outgoing import OutgoingAuth
from toolsearch.sessions import BackendSession
from toolsearch.targets import BackendTarget

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


async def touched(direct: Client, mark: str = "") -> str:
    arguments = {"mark": mark} if mark else {}
    return str((await direct.call_tool("touch", arguments)).content[0].text)  # type: ignore[union-attr]


def heard_mark(listener: Listener, mark: str) -> bool:
    """Whether the stream has carried the log line of the touch marked `mark`."""
    return any(
        m.get("method") == LOGGED and m["params"]["data"] == f"the note changed ({mark})"
        for m in listener.messages
    )


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
            # The stream may have opened in the middle of a touch, and a touch may still be on its
            # way: a marked touch last, and the stream has carried everything before it once it
            # carries that touch's log line (one stream, in order).
            assert await touched(direct, "read up to here") == "told 1"
            await wait_for(lambda: heard_mark(first, "read up to here"))
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


def test_a_cursor_stays_within_its_length_keeping_an_earlier_mark_rather_than_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream_cursor, "MAX_ID", 100)
    cursor = StreamCursor()
    cursor.moved("a", "t 1")
    cursor.moved("b", "t " + "x" * 100)  # would make the id too long: b is not followed
    cursor.moved("a", "t " + "y" * 100)  # nor is this mark: a's earlier one stays
    assert cursor.marks == {"a": "t 1"} and len(cursor.event_id()) <= 100
    with pytest.raises(ValueError, match="longer than 100"):
        StreamCursor.parse("at1." + "A" * 101)


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


CHANGED = {"jsonrpc": "2.0", "method": "notifications/resources/list_changed"}
SESSION = BackendSession("backend-session", "2025-11-25")


def backend(answer: Callable[[httpx2.Request], httpx2.Response]) -> tuple[httpx2.AsyncClient, BackendTarget]:
    """A backend of canned answers to the standalone stream's GETs, and its target (events of at most
    1,000 bytes)."""
    target = BackendTarget("canned", "http://canned/mcp", OutgoingAuth(), "", 5.0, 1000, SESSION)
    return httpx2.AsyncClient(transport=httpx2.MockTransport(answer)), target


def stream_of(*events: str) -> httpx2.Response:
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content="".join(events).encode()
    )


async def test_a_backend_that_refuses_the_id_it_is_resumed_from_is_read_from_now_on() -> None:
    asked: list[str | None] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        asked.append(request.headers.get("last-event-id"))
        if request.headers.get("last-event-id"):
            return httpx2.Response(
                400, json={"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": "?"}}
            )
        return stream_of(f"id: s/9\ndata: {json.dumps(CHANGED)}\n\n")

    http, target = backend(answer)
    heard: list[tuple[str, str]] = []
    position = StreamPosition("s/3")

    async def deliver(backend_id: str, message: Mapping[str, Any]) -> None:
        heard.append((str(message["method"]), position.last_id))

    async with http:
        assert await read_standalone(http, target, SESSION, deliver, position=position)
    assert asked == ["s/3", None]
    assert heard == [("notifications/resources/list_changed", "s/9")]


async def test_a_standalone_stream_past_its_bound_is_not_read_past_its_event_again() -> None:
    http, target = backend(lambda request: stream_of(f"id: s/4\ndata: {'x' * 2000}\n\n"))
    position = StreamPosition("s/3")

    async def deliver(backend_id: str, message: Mapping[str, Any]) -> None:
        raise AssertionError("nothing is delivered from an event over the bound")

    async with http:
        assert await read_standalone(http, target, SESSION, deliver, position=position)
    assert position.last_id == ""  # so the stream is not opened again from there


def test_a_mark_is_followed_only_in_the_backend_session_it_came_from() -> None:
    marked = mark(SESSION, "_GET_stream/7")
    assert resumed_from(SESSION, marked) == "_GET_stream/7"
    assert resumed_from(BackendSession("another", "2025-11-25"), marked) == ""
    assert mark(SESSION, "") == "" and resumed_from(SESSION, "") == ""
