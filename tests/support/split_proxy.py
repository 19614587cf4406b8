"""A reverse proxy in front of two router replicas: a client's answers go to the other one.

    with split_proxy(first_url, second_url, port) as (url, proxy):
        ...  # a client of `url` talks to `first`, but each JSON-RPC response it posts reaches `second`

    with split_proxy(first_url, second_url, port, cut_after=2) as (url, proxy):
        ...  # and a call's stream is cut after two messages: its resumption reaches `second`

What a load balancer may do to a client that answers a request of the server: its POST carrying the
answer (a JSON-RPC response, or a 2026-07-28 request retried with `inputResponses` or
`requestState`) lands on another replica than the one that asked. Everything else (requests,
notifications, GET and DELETE) goes to the first replica, headers and bodies as they
came (the Host header too, which a router on loopback allows at any port), answers streamed back
as they arrive. It runs in a thread of the test process, under uvicorn, on a loopback port.

With `cut_after`, it is also a connection that drops: a POST answered with an event stream gets
that many events with a message (the priming event aside) and then its end, the connection to the
replica closed; the `GET` with `Last-Event-ID` that resumes it goes to the second replica.
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


def _answering(body: bytes) -> str:
    """What a posted body is to the proxy: "answer" for a response to a request of the server,
    "retry" for a 2026-07-28 request retried with answers to its round (or the state it was given),
    else the empty string."""
    try:
        message = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(message, dict):
        return ""
    if "method" not in message:
        return "answer" if "result" in message or "error" in message else ""
    params = message.get("params")
    retried = isinstance(params, dict) and ("inputResponses" in params or "requestState" in params)
    return "retry" if retried else ""


class SplitProxy:
    """The ASGI app: posted answers and retries to `second`, everything else to `first` (both base URLs)."""

    def __init__(self, first: str, second: str, cut_after: int | None = None) -> None:
        self.first = first
        self.second = second
        self.cut_after = cut_after
        self.answers = 0  # answers sent to the second replica
        self.retries = 0  # 2026-07-28 retries sent to the second replica
        self.cuts = 0  # streams cut short
        self.resumptions = 0  # GETs with Last-Event-ID sent to the second replica

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
        answering = _answering(body) if scope["method"] == "POST" else ""
        if answering == "answer":
            base, self.answers = self.second, self.answers + 1
        elif answering == "retry":
            base, self.retries = self.second, self.retries + 1
        resumes = any(k.lower() == b"last-event-id" for k, _ in scope["headers"])
        if scope["method"] == "GET" and resumes and self.cut_after is not None:
            base, self.resumptions = self.second, self.resumptions + 1
        url = base + scope["path"] + (f"?{scope['query_string'].decode()}" if scope["query_string"] else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]
        async with httpx2.AsyncClient(timeout=120) as client:
            request = client.build_request(scope["method"], url, headers=headers, content=body)
            response = await client.send(request, stream=True)
            try:
                out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP]
                await send({"type": "http.response.start", "status": response.status_code, "headers": out})
                streamed = response.headers.get("content-type", "").startswith("text/event-stream")
                if scope["method"] == "POST" and streamed and self.cut_after is not None:
                    await self._cut_short(response, send, self.cut_after)
                else:
                    async for chunk in response.aiter_raw():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                await response.aclose()

    async def _cut_short(self, response: httpx2.Response, send: Send, events: int) -> None:
        """Pass on whole events until `events` of them carried a message, then stop."""
        pending = b""
        async for chunk in response.aiter_raw():
            pending += chunk
            while b"\r\n\r\n" in pending:
                event, pending = pending.split(b"\r\n\r\n", 1)
                await send({"type": "http.response.body", "body": event + b"\r\n\r\n", "more_body": True})
                if b"\ndata: {" in b"\n" + event:
                    events -= 1
                if events <= 0:
                    self.cuts += 1
                    return


@contextmanager
def split_proxy(
    first: str, second: str, port: int, cut_after: int | None = None
) -> Iterator[tuple[str, SplitProxy]]:
    """Serve a `SplitProxy` on loopback `port`; its base URL (`http://localhost:PORT`) and itself."""
    proxy = SplitProxy(first, second, cut_after)
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
