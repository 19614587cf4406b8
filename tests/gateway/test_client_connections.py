"""The router's client connections at the socket (router/frontdoor/connections.py), driven directly:
what the kernel has done to a connection decides the path, so these need no server and no timing."""

from __future__ import annotations

import asyncio
import select
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from router.frontdoor.bounds import FrontDoor
from router.frontdoor.connections import GuardedProtocol, protocol_for
from tests.support.waits import wait_for

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
