"""A reverse proxy in front of two router replicas: a client's answers go to the other one.

    with split_proxy(first_url, second_url, port) as (url, proxy):
        ...  # a client of `url` talks to `first`, but each JSON-RPC response it posts reaches `second`

What a load balancer may do to a client that answers a request of the server: its POST carrying the
answer lands on another replica than the one whose stream carried the request. Everything else
(requests, notifications, GET and DELETE) goes to the first replica, headers and bodies as they
came (the Host header too, which a router on loopback allows at any port), answers streamed back
as they arrive. It runs in a thread of the test process, under uvicorn, on a loopback port.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
import uvicorn
from starlette.types import Receive, Scope, Send

START_TIMEOUT = 10.0
_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length"}


def _is_answer(body: bytes) -> bool:
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message)
    )


class SplitProxy:
    """The ASGI app: posted answers to `second`, everything else to `first` (both base URLs)."""

    def __init__(self, first: str, second: str) -> None:
        self.first = first
        self.second = second
        self.answers = 0  # answers sent to the second replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        base = self.first
        if scope["method"] == "POST" and _is_answer(body):
            base, self.answers = self.second, self.answers + 1
        url = base + scope["path"] + (f"?{scope['query_string'].decode()}" if scope["query_string"] else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]
        async with httpx2.AsyncClient(timeout=120) as client:
            request = client.build_request(scope["method"], url, headers=headers, content=body)
            response = await client.send(request, stream=True)
            try:
                out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP]
                await send({"type": "http.response.start", "status": response.status_code, "headers": out})
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                await response.aclose()


@contextmanager
def split_proxy(first: str, second: str, port: int) -> Iterator[tuple[str, SplitProxy]]:
    """Serve a `SplitProxy` on loopback `port`; its base URL (`http://localhost:PORT`) and itself."""
    proxy = SplitProxy(first, second)
    config = uvicorn.Config(proxy, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError(f"the split proxy did not start within {START_TIMEOUT:g}s")
        time.sleep(0.02)
    try:
        yield f"http://localhost:{port}", proxy
    finally:
        server.should_exit = True
        thread.join(timeout=START_TIMEOUT)
