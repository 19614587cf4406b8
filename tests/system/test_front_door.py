"""The router's front door: Host and Origin checked, oversized bodies answered, connections bounded.

Real processes on loopback (a catalog server, routers) in front of an indexer served from the test's
loop (tests/support/routers.py). Clients are the SDK's, Python's urllib, and raw sockets for the
requests no well-behaved client sends: browser-shaped rebinding requests, a slowloris, a stalled body.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import httpx2
import psutil
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.datastructures import Headers

from router.frontdoor.origins import HostPolicy
from tests.support.processes import Proc
from tests.support.routers import LightStack, light_stack
from tests.support.stack import HEADERS, INITIALIZE, ROOT
from tests.support.waits import wait_for
from toolsearch.config import load_config

LIMIT = 8  # router.max_connections of these tests
BOUNDS = {"max_connections": LIMIT, "header_timeout": 1.0, "body_timeout": 1.5, "keep_alive_timeout": 3.0}
APP = "http://app.example:3000"  # a web client's origin, listed in the bounded router's allowed_origins
WAIT = 10.0  # seconds any answer or close may take on a busy machine
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Front:
    """The stack, and its router under small bounds (the same one: `bounded`, `bounded_url`)."""

    def __init__(self, stack: LightStack) -> None:
        self.stack = stack
        self.bounded: Proc = stack.router
        self.bounded_url = stack.router_url
        self.port = int(stack.router_url.rsplit(":", 1)[1])


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def front(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Front]:
    settings = {**BOUNDS, "allowed_origins": [APP]}
    async with light_stack(tmp_path_factory.mktemp("front"), router=settings, router_process=True) as stack:
        yield Front(stack)


async def post(url: str, body: object, **headers: str) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        return await http.post(url, json=body, headers={**HEADERS, **headers})


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def _closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := await asyncio.wait_for(reader.read(65536), WAIT):
        data += chunk
    return data


# Host and Origin


def browser(host: str, origin: str) -> dict[str, str]:
    """The headers a browser adds to a page's fetch() of its own origin."""
    return {
        "Host": host,
        "Origin": origin,
        "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/140.0",
        "Sec-Fetch-Site": "same-origin",
        "Sec-Fetch-Mode": "cors",
        "Referer": f"{origin}/",
    }


async def test_a_rebinding_page_is_refused_before_anything_happens(front: Front) -> None:
    evil = f"evil.example:{front.port}"
    response = await post(front.stack.mcp_url, INITIALIZE, **browser(evil, f"http://{evil}"))
    assert response.status_code == 403
    message = response.json()["error"]["message"]
    assert f'Host header "{evil}" is not allowed' in message and "router.allowed_hosts" in message
    assert "mcp-session-id" not in response.headers


async def test_another_origin_is_refused_even_on_the_right_host(front: Front) -> None:
    host = f"127.0.0.1:{front.port}"
    response = await post(front.stack.mcp_url, INITIALIZE, **browser(host, "http://evil.example"))
    assert response.status_code == 403
    message = response.json()["error"]["message"]
    assert 'Origin "http://evil.example" is not allowed' in message and "router.allowed_origins" in message


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1", "[::1]"])
async def test_the_routers_own_loopback_origins_are_served(front: Front, name: str) -> None:
    host = f"{name}:{front.port}"
    response = await post(front.stack.mcp_url, INITIALIZE, **browser(host, f"http://{host}"))
    assert response.status_code == 200, response.text
    assert response.headers["mcp-session-id"]


async def test_a_loopback_name_on_another_port_is_served(front: Front) -> None:
    # what a proxy in front, or another replica's port, sends on: no rebinding page can send it
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        response = await http.get(f"{front.stack.router_url}/healthz", headers={"Host": "localhost:8443"})
    assert response.status_code == 200


async def test_clients_without_origin_are_served(front: Front) -> None:
    http = httpx2.AsyncClient(timeout=WAIT)
    transport = streamable_http_client(front.stack.mcp_url, http_client=http)
    async with http, Client(transport, mode="legacy") as client:
        found = await client.call_tool("find_tool", {"tool_description": "cocktail recipes"})
    assert not found.is_error


async def test_a_listed_origin_gets_what_a_browser_needs_to_call_across_origins(front: Front) -> None:
    preflight = {
        "Origin": APP,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        allowed = await http.options(f"{front.bounded_url}/mcp", headers=preflight)
        refused = await http.options(
            f"{front.bounded_url}/mcp", headers={**preflight, "Origin": "http://evil.example"}
        )
        posted = await http.post(
            f"{front.bounded_url}/mcp", json=INITIALIZE, headers={**HEADERS, "Origin": APP}
        )
    assert allowed.status_code == 204 and allowed.headers["access-control-allow-origin"] == APP
    assert "mcp-session-id" in allowed.headers["access-control-allow-headers"]
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
    assert posted.status_code == 200 and posted.headers["access-control-allow-origin"] == APP
    assert "mcp-session-id" in posted.headers["access-control-expose-headers"]


def test_a_wildcard_bind_checks_no_host_but_still_checks_origin() -> None:
    # the compose stack's router: 0.0.0.0, reached as 127.0.0.1:8000 from the host and its healthcheck
    listen = load_config(ROOT / "docker" / "toolsearch.yaml").router.listen
    policy = HostPolicy.for_listen(listen, [], [])
    scope = {"type": "http", "scheme": "http", "server": ("172.18.0.4", 8000)}

    def problems(headers: dict[str, str]) -> tuple[str | None, str | None]:
        h = Headers(headers)
        return policy.host_problem(scope, h), policy.origin_problem(scope, h)

    assert problems({"host": "127.0.0.1:8000"}) == (None, None)
    assert problems({"host": "router:8000"}) == (None, None)
    assert problems({"host": "localhost:8000", "origin": "http://localhost:8000"}) == (None, None)
    assert problems({"host": "localhost:8000", "origin": "http://evil.example"})[1] is not None
    listed = HostPolicy.for_listen(listen, ["tools.example.com"], ["https://app.example.com"])
    assert listed.host_problem(scope, Headers({"host": "evil.example"})) is not None
    assert listed.host_problem(scope, Headers({"host": "tools.example.com"})) is None
    allowed = Headers({"host": "tools.example.com", "origin": "https://app.example.com"})
    assert listed.origin_problem(scope, allowed) is None
    own = Headers({"host": "tools.example.com", "origin": "https://tools.example.com"})
    assert listed.origin_problem(scope, own) is None


# Oversized bodies


def urllib_post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with DIRECT.open(request, timeout=WAIT) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        assert exc.headers.get("content-type") == "application/json"
        assert "router.max_body_bytes" in json.loads(exc.read())["error"]["message"]
        return exc.code


async def test_an_oversized_body_gets_its_413_every_time_with_urllib(front: Front) -> None:
    opened = await post(front.stack.mcp_url, INITIALIZE)
    headers = {
        **HEADERS,
        "Mcp-Session-Id": opened.headers["mcp-session-id"],
        "MCP-Protocol-Version": "2025-11-25",
    }
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"pad": "x" * 3_000_000}}
    body = json.dumps(call).encode()
    codes = [await asyncio.to_thread(urllib_post, front.stack.mcp_url, body, headers) for _ in range(20)]
    assert codes == [413] * 20  # no connection reset: urllib raises URLError for one


async def test_a_body_declared_far_too_large_is_refused_unread(front: Front) -> None:
    # Expect: 100-continue: a body the router would only drop is never asked for
    reader, writer = await _connect(front.stack.router_url)
    writer.write(
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{front.port}\r\nContent-Type: application/json\r\n"
        "Content-Length: 100000000\r\nExpect: 100-continue\r\n\r\n".encode()
    )
    answer = await _closed_by_server(reader)  # returns once the router closed the connection
    writer.close()
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"100 Continue" not in answer and b"connection: close" in answer.lower()


REFUSALS = [  # (request line, content type, the status it is refused with)
    ("PUT /mcp", "application/json", 405),
    ("PUT /healthz", "application/json", 405),
    ("POST /mcp", "text/plain", 415),
    ("POST /mcp", "application/json", 413),
    ("DELETE /mcp", "application/json", 400),
    ("POST /nowhere", "application/json", 404),
]


async def _refused_with_a_body(front: Front, line: str, content_type: str, size: int, close: bool) -> bytes:
    """What a client that writes its whole request before it reads gets back (its head)."""
    reader, writer = await _connect(front.stack.router_url)
    head = f"{line} HTTP/1.1\r\nHost: 127.0.0.1:{front.port}\r\nContent-Type: {content_type}\r\n"
    head += f"Content-Length: {size}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n"
    writer.write(head.encode())
    chunk = b"x" * 65536
    for _ in range(size // len(chunk)):
        writer.write(chunk)
        await writer.drain()  # a reset would raise here
    writer.write(b"x" * (size % len(chunk)))
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    finally:
        writer.close()


@pytest.mark.parametrize("close", [False, True], ids=["kept", "connection-close"])
@pytest.mark.parametrize("size", [2_000_000, 6_000_000], ids=["within-the-drain", "beyond-the-drain"])
async def test_every_refusal_of_a_large_body_is_read_by_a_client_that_sends_it_whole(
    front: Front, size: int, close: bool
) -> None:
    # the drain is 4 MiB (four times router.max_body_bytes): beyond it, the close lingers
    for line, content_type, status in REFUSALS:
        answer = await _refused_with_a_body(front, line, content_type, size, close)
        assert answer.startswith(f"HTTP/1.1 {status} ".encode()), (line, answer[:200])


# Connections


def _held_connections(front: Front) -> int:
    """The client connections the bounded router holds open (its sockets on its own port)."""
    sockets = psutil.Process(front.bounded.pid).net_connections(kind="tcp")
    return sum(
        1 for s in sockets if s.laddr and s.laddr.port == front.port and s.status != psutil.CONN_LISTEN
    )


async def test_connections_beyond_the_limit_get_503_at_once_and_are_logged_once(front: Front) -> None:
    # an earlier test's connections may still be closing, and count until they have
    await wait_for(lambda: _held_connections(front) == 0, within=WAIT)
    idle = [await _connect(front.bounded_url) for _ in range(LIMIT)]
    try:
        refused = [await _connect(front.bounded_url) for _ in range(12)]
        answers = await asyncio.gather(*(_closed_by_server(reader) for reader, _ in refused))
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
            body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            assert "connection limit" in body["error"]["message"]
        for _, writer in refused:
            writer.close()
        # the idle ones never sent a request head: closed after header_timeout, quietly
        for reader, _ in idle:
            assert await _closed_by_server(reader) == b""
    finally:
        for _, writer in idle:
            writer.close()
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        assert (await http.get(f"{front.bounded_url}/healthz")).status_code == 200
    output = front.bounded.output()
    assert output.count("refused connections beyond router.max_connections") == 1, output


async def _trickled(
    front: Front,
    interval: float,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    started: float | None = None,
) -> float:
    """Send a request head one byte every `interval` seconds; the seconds from `started` (the loop's
    time; by default now) until the router answers 408 and closes (the head would take far longer)."""
    head = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: {'a' * 200}\r\n\r\n".encode()
    if started is None:
        started = asyncio.get_running_loop().time()

    async def trickle() -> None:
        for byte in head:
            if writer.is_closing():
                return
            writer.write(bytes([byte]))
            await asyncio.sleep(interval)  # the slow client's pace, not a wait for the router

    sending = asyncio.create_task(trickle())
    try:
        answer = await _closed_by_server(reader)
    finally:
        sending.cancel()
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    return asyncio.get_running_loop().time() - started


async def test_slowloris_connections_are_cut_at_the_header_timeout_while_other_clients_are_served(
    front: Front,
) -> None:
    await wait_for(lambda: _held_connections(front) == 0, within=WAIT)
    # the head's deadline runs from the connection's opening: each is timed from just before it
    loop = asyncio.get_running_loop()
    slow = [(loop.time(), await _connect(front.bounded_url)) for _ in range(LIMIT - 2)]  # room for one
    cutting = asyncio.gather(
        *(_trickled(front, 0.25, reader, writer, opened) for opened, (reader, writer) in slow)
    )
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        while not cutting.done():  # served all along, each answer within a moment
            response = await http.get(f"{front.bounded_url}/healthz")
            assert response.status_code == 200
    took = await cutting
    # the head needs 60 s at this pace; each is cut at the deadline, not a byte's interval later
    assert all(BOUNDS["header_timeout"] - 0.1 < t < BOUNDS["header_timeout"] + 3 for t in took), took


async def test_a_slow_head_on_a_kept_connection_has_the_header_timeout_from_its_first_byte(
    front: Front,
) -> None:
    reader, writer = await _connect(front.bounded_url)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    first = await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), WAIT)
    assert first.startswith(b"HTTP/1.1 200 ")
    took = await _trickled(front, 0.25, reader, writer)
    assert BOUNDS["header_timeout"] - 0.1 < took < BOUNDS["header_timeout"] + 3, took


async def test_a_stalled_body_is_cut_with_408(front: Front) -> None:
    reader, writer = await _connect(front.bounded_url)
    writer.write(
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"jsonrpc": '
    )
    answer = await _closed_by_server(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"did not arrive within 1.5s" in answer


async def test_an_idle_kept_connection_outlives_the_header_timeout_and_closes_after_keep_alive(
    front: Front,
) -> None:
    reader, writer = await _connect(front.bounded_url)
    request = f"GET /healthz HTTP/1.1\r\nHost: {front.bounded_url.removeprefix('http://')}\r\n\r\n".encode()
    answers = []
    for _ in range(2):
        writer.write(request)
        answers.append(await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), WAIT))
        # idle past router.header_timeout, which bounds a head once it has begun, not the idle time
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(1), BOUNDS["header_timeout"] + 0.5)
    started = asyncio.get_running_loop().time()
    assert await _closed_by_server(reader) == b""  # then closed, quietly, once idle for keep_alive
    writer.close()
    waited = asyncio.get_running_loop().time() - started + BOUNDS["header_timeout"] + 0.5
    assert all(a.startswith(b"HTTP/1.1 200 ") and b"keep-alive: timeout=3\r\n" in a for a in answers)
    assert BOUNDS["keep_alive_timeout"] - 0.1 < waited < BOUNDS["keep_alive_timeout"] + 3, waited


async def test_a_new_connection_at_the_limit_takes_the_place_of_the_longest_idle_one(front: Front) -> None:
    await wait_for(lambda: _held_connections(front) == 0, within=WAIT)
    host = front.bounded_url.removeprefix("http://")
    kept = []
    for _ in range(LIMIT):  # each answered once, then idle
        reader, writer = await _connect(front.bounded_url)
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), WAIT)
        kept.append((reader, writer))
    try:
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            assert (await http.get(f"{front.bounded_url}/healthz")).status_code == 200
        oldest, _ = kept[0]
        assert await _closed_by_server(oldest) == b""  # given up, quietly
    finally:
        for _, writer in kept:
            writer.close()


async def test_a_flood_of_invalid_requests_is_one_log_line(front: Front) -> None:
    for _ in range(20):
        reader, writer = await _connect(front.bounded_url)
        writer.write(b"NOT A REQUEST\r\n\r\n")
        assert (await _closed_by_server(reader)).startswith(b"HTTP/1.1 400 ")
        writer.close()
    assert front.bounded.output().count("Invalid HTTP request received") == 1, front.bounded.output()
