"""Whom a stdio server's requests of its client and its log messages go to: the caller of the one
call in flight in its process (bridge/speaking/callers.py). In process: the callers are stand-ins behind the
`Caller` protocol, which the bridge's forwarding server implements over the call's own stream."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

import mcp_types as types
import pytest

from bridge.speaking.callers import Callers

SAMPLE = types.CreateMessageRequestParams(
    messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi?"))],
    max_tokens=5,
)


class StandIn:
    """A caller that declared `capabilities`, answers every request with `answer`, and keeps what
    it was asked and told."""

    def __init__(self, *capabilities: str, answer: dict[str, Any] | None = None) -> None:
        self.capabilities = capabilities
        self.answer = answer or {
            "role": "assistant",
            "content": {"type": "text", "text": "hello"},
            "model": "m",
        }
        self.asked: list[tuple[str, Mapping[str, Any] | None]] = []
        self.told: list[types.LoggingMessageNotification] = []

    def answers(self, capability: str) -> bool:
        return capability in self.capabilities

    async def ask(self, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        self.asked.append((method, params))
        return self.answer

    async def tell(self, notification: types.LoggingMessageNotification) -> None:
        self.told.append(notification)


def _log() -> types.LoggingMessageNotification:
    return types.LoggingMessageNotification(
        params=types.LoggingMessageNotificationParams(level="info", data="x")
    )


async def test_a_request_goes_to_the_caller_of_the_one_call_in_flight_and_its_answer_back() -> None:
    callers = Callers("time")
    able = StandIn("sampling")
    with callers.waiting(able):
        result = await callers.sampling(None, SAMPLE)  # type: ignore[arg-type]
    assert isinstance(result, types.CreateMessageResult)
    assert result.content == types.TextContent(type="text", text="hello")
    assert able.asked == [
        ("sampling/createMessage", SAMPLE.model_dump(by_alias=True, mode="json", exclude_none=True))
    ]


async def test_a_request_beside_another_call_is_refused_though_only_one_caller_could_answer() -> None:
    # the request may be the other call's, whose caller cannot answer it: never handed to another
    callers = Callers("time")
    able, unable = StandIn("sampling"), StandIn("roots")
    with callers.waiting(able), callers.waiting(unable):
        result = await callers.sampling(None, SAMPLE)  # type: ignore[arg-type]
    assert isinstance(result, types.ErrorData)
    assert result.code == types.INVALID_REQUEST
    assert "2 calls run in backend time's one process at once" in result.message
    assert able.asked == unable.asked == []


async def test_a_request_two_callers_in_flight_could_answer_is_refused_naming_per_session_isolation() -> None:
    callers = Callers("time")
    first, second = StandIn("elicitation"), StandIn("elicitation")
    with callers.waiting(first), callers.waiting(second):
        result = await callers.elicitation(
            None,  # type: ignore[arg-type]
            types.ElicitRequestFormParams(
                message="name?", requested_schema={"type": "object", "properties": {}}
            ),
        )
    assert isinstance(result, types.ErrorData)
    assert result.code == types.INVALID_REQUEST
    assert "2 calls run in backend time's one process at once" in result.message
    assert "isolation: per_session" in result.message
    assert first.asked == second.asked == []


async def test_a_request_no_caller_in_flight_can_answer_is_refused_at_once() -> None:
    callers = Callers("time")
    with callers.waiting(StandIn("sampling")):
        result = await callers.roots(None)  # type: ignore[arg-type]
    assert result == types.ErrorData(
        code=types.METHOD_NOT_FOUND, message="no caller that can answer roots/list is waiting on backend time"
    )


async def test_an_answer_that_is_not_the_requests_result_is_refused_as_unusable() -> None:
    callers = Callers("time")
    with callers.waiting(StandIn("sampling", answer={"nonsense": True})):
        result = await callers.sampling(None, SAMPLE)  # type: ignore[arg-type]
    assert isinstance(result, types.ErrorData)
    assert result.message == "the caller answered sampling/createMessage with something unusable"


@pytest.mark.parametrize("in_flight", [0, 2])
async def test_a_log_message_goes_to_the_one_call_in_flight_and_otherwise_to_the_listeners(
    in_flight: int,
) -> None:
    callers = Callers("time")
    one = StandIn()
    with callers.waiting(one):
        assert await callers.log(_log())
    assert len(one.told) == 1
    stand_ins = [StandIn() for _ in range(in_flight)]
    with ExitStack() as flight:
        for stand_in in stand_ins:
            flight.enter_context(callers.waiting(stand_in))
        assert not await callers.log(_log())  # the listeners' to have (bridge/keeping/listeners.py)
    assert all(not s.told for s in stand_ins)
