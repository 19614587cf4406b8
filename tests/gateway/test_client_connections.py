"""The router's client connections at the socket (router/frontdoor/connections.py), driven directly:
what the kernel has done to a connection decides the path, so these need no server and no timing."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from router.frontdoor.bounds import FrontDoor
from router.frontdoor.connections import GuardedProtocol, protocol_for
from router.frontdoor.lingering import LingeringTransport
from tests.support.waits import WAIT, wait_for

HEAD = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()  # the body never comes whole: uvicorn then closes the connection itself


@pytest.fixture
async def accepted() -> AsyncIterator[tuple[socket.socket, socket.socket]]:
    """A loopback connection: the router's end (accepted) and the client's."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
    ours.setblocking(False)
    try:
        yield ours, client
    finally:
        client.close()
        ours.close()


async def test_a_close_while_a_reset_client_still_owed_its_body_ends_the_connection_quietly(
    accepted: tuple[socket.socket, socket.socket],
) -> None:
    ours, client = accepted
    loop = asyncio.get_running_loop()
    failures: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: failures.append(context))
    try:
        config = Config(app=_app, log_level="critical")
        config.load()
        front = FrontDoor(max_connections=10, header_timeout=10, body_timeout=10, keep_alive_timeout=10)
        protocol: GuardedProtocol = protocol_for(front)(config, ServerState(), {})
        transport, _ = await loop.connect_accepted_socket(lambda: protocol, ours)
        protocol.data_received(HEAD)  # a head whose body is still due: uvicorn's close would linger
        # the client resets its connection (SO_LINGER 0), and the reset has arrived before the close
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        assert select.select([ours], [], [], 10)[0], "the reset did not arrive"
        protocol.transport.close()  # what uvicorn does after an answer with Connection: close
        await wait_for(transport.is_closing)
        await asyncio.sleep(0)
        assert not failures, failures
        assert front.lingering == 0
    finally:
        loop.set_exception_handler(None)


# The request's way through the parser (httptools' llhttp under uvicorn), at a real socket


class Served:
    """A connection the guarded protocol serves, and the client's end of it."""

    def __init__(self, client: socket.socket, protocol: GuardedProtocol) -> None:
        self.client = client
        self.protocol = protocol

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.client, data)

    async def until_closed(self) -> bytes:
        """Everything the router sends until it ends its side."""
        loop, data = asyncio.get_running_loop(), b""
        async with asyncio.timeout(WAIT):
            while chunk := await loop.sock_recv(self.client, 65536):
                data += chunk
        return data

    async def answers(self, count: int) -> bytes:
        """What the router sent once `count` answers have arrived."""
        loop, data = asyncio.get_running_loop(), b""
        async with asyncio.timeout(WAIT):
            while data.count(b"HTTP/1.1 ") < count or not data.endswith(b"}"):
                data += await loop.sock_recv(self.client, 65536)
        return data


async def _answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that reads the whole body and answers with its path and the body's length."""
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = json.dumps({"path": scope["path"], "bytes": size}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def _serving(
    accepted: tuple[socket.socket, socket.socket], app: Any = _answer, header_timeout: float = 10
) -> AsyncIterator[Served]:
    """The guarded protocol serving `app` on the accepted end of a loopback connection."""
    ours, client = accepted
    client.setblocking(False)
    config = Config(app=app, log_level="critical")
    config.load()
    front = FrontDoor(
        max_connections=10, header_timeout=header_timeout, body_timeout=10, keep_alive_timeout=10
    )
    protocol: GuardedProtocol = protocol_for(front)(config, ServerState(), {})
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(lambda: protocol, ours)
    try:
        yield Served(client, protocol)
    finally:
        transport.close()
        for task in list(protocol.tasks):
            task.cancel()


@pytest.fixture
async def served(accepted: tuple[socket.socket, socket.socket]) -> AsyncIterator[Served]:
    async with _serving(accepted) as serving:
        yield serving


async def test_a_request_head_over_16_kib_in_one_piece_is_refused_with_400(served: Served) -> None:
    await served.send(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 17_000 + b"\r\n\r\n")
    assert (await served.until_closed()).startswith(b"HTTP/1.1 400 ")


async def test_a_request_head_growing_past_16_kib_is_refused_before_it_ends(served: Served) -> None:
    await served.send(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
    for _ in range(17):  # one header line that never ends: the parser would buffer it all
        await served.send(b"a" * 1024)
    assert (await served.until_closed()).startswith(b"HTTP/1.1 400 ")


async def test_a_request_head_under_16_kib_with_a_large_body_in_the_same_piece_is_served(
    served: Served,
) -> None:
    body = b"x" * 100_000
    await served.send(
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    answer = await served.answers(1)
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"bytes": 100000' in answer


async def test_an_http_1_1_request_without_host_is_refused_with_400(served: Served) -> None:
    await served.send(b"GET /healthz HTTP/1.1\r\n\r\n")
    assert (await served.until_closed()).startswith(b"HTTP/1.1 400 ")


async def test_pipelined_requests_are_answered_in_order(served: Served) -> None:
    one = b"GET /first HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    two = b"POST /second HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\n\r\nabc"
    await served.send(one + two)
    answers = await served.answers(2)
    assert answers.index(b'"path": "/first"') < answers.index(b'"path": "/second"')
    assert b'"bytes": 3' in answers


async def test_a_head_begun_while_the_answer_before_it_runs_has_its_deadline_from_that_answers_end(
    accepted: tuple[socket.socket, socket.socket],
) -> None:
    release = asyncio.Event()

    async def slow_first(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/first":
            await release.wait()
        await _answer(scope, receive, send)

    async with _serving(accepted, slow_first, header_timeout=0.5) as served:
        # the second head's first bytes come with the first request, the rest once it is answered
        await served.send(b"GET /first HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /sec")
        # longer than header_timeout: the first answer's time is not the second head's
        await asyncio.sleep(1.0)
        release.set()
        first = await served.answers(1)
        await served.send(b"ond HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answers = first + await served.answers(1)
    assert b'"path": "/first"' in answers and b'"path": "/second"' in answers


class _Sent(asyncio.Transport):
    """A socket's transport that records each write it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


class _Closer:
    def close_transport(self) -> None: ...

    def lingers(self) -> bool:
        return False


async def test_what_uvicorn_writes_in_one_turn_leaves_in_one_write() -> None:
    sent = _Sent()
    transport = LingeringTransport(sent, _Closer(), asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")  # an answer's head, then its body
    transport.write(b"{}")
    assert transport.get_write_buffer_size() == 40 and sent.writes == []
    await wait_for(lambda: bool(sent.writes))  # the next turn of the loop
    assert sent.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    transport.write(b"later")
    transport.close()  # a close sends what is pending first
    assert sent.writes[-1] == b"later"
