"""How the bridge answers one request of a 2026-07-28 stdio backend (bridge/serving/modern_endpoint.py): JSON
when nothing comes before the answer, an event stream when notifications do, and an error instead
of an unbounded backlog for a client that does not read them. In process: the upstream is a
stand-in behind the one method the endpoint calls, `exchange`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import anyio
from starlette.types import Message

from bridge.serving.modern_endpoint import EVENT_BACKLOG, _Exchange
from bridge.speaking.modern_upstream import Deliver


class StandIn:
    """An upstream that sends `notifications` to the caller at once (to one that takes them), then
    answers `answer`."""

    backend_id = "modern"

    def __init__(self, answer: dict[str, Any], notifications: int = 0) -> None:
        self.answer = answer
        self.notifications = notifications

    async def exchange(self, request: Mapping[str, Any], deliver: Deliver | None) -> dict[str, Any]:
        for step in range(self.notifications if deliver is not None else 0):
            deliver({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": step}})
        return {**self.answer, "id": request["id"]}


async def _answered(upstream: StandIn, streams: bool = True) -> tuple[int, list[bytes]]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}
    await _Exchange(upstream, request, streams).run(send, receive)  # type: ignore[arg-type]
    return sent[0]["status"], [m["body"] for m in sent[1:]]


def _events(bodies: list[bytes]) -> list[dict[str, Any]]:
    lines = b"".join(bodies).decode().splitlines()
    return [json.loads(line[5:]) for line in lines if line.startswith("data:")]


async def test_an_answer_with_nothing_before_it_is_json_with_the_status_its_error_maps_to() -> None:
    missing = {"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method not found"}}
    status, bodies = await _answered(StandIn(missing))
    assert status == 404
    assert json.loads(b"".join(bodies)) == {**missing, "id": 7}


async def test_notifications_make_an_event_stream_that_ends_with_the_answer() -> None:
    status, bodies = await _answered(StandIn({"jsonrpc": "2.0", "result": {"content": []}}, 3))
    events = _events(bodies)
    assert status == 200
    assert [e["params"]["progress"] for e in events[:-1]] == [0, 1, 2]
    assert events[-1] == {"jsonrpc": "2.0", "result": {"content": []}, "id": 7}


async def test_a_client_that_falls_too_far_behind_gets_what_was_held_then_an_error() -> None:
    upstream = StandIn({"jsonrpc": "2.0", "result": {"content": []}}, EVENT_BACKLOG + 5)
    status, bodies = await _answered(upstream)
    events = _events(bodies)
    assert status == 200
    assert len(events) == EVENT_BACKLOG + 1  # the backlog, then the error, nothing more held
    assert events[-1]["id"] == 7
    assert events[-1]["error"]["message"] == (
        f"backend modern: the client fell {EVENT_BACKLOG} notifications behind, and the request was ended"
    )


async def test_a_client_that_takes_json_only_gets_the_answer_without_the_notifications() -> None:
    upstream = StandIn({"jsonrpc": "2.0", "result": {"content": []}}, 3)
    status, bodies = await _answered(upstream, streams=False)
    assert status == 200
    assert json.loads(b"".join(bodies)) == {"jsonrpc": "2.0", "result": {"content": []}, "id": 7}
