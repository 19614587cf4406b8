"""`/status` and `/status.json`: what a person sees of the indexer and the router, in a real browser.

A light stack (real router processes, the test's indexer) with JWT auth on one router and none on
a second over the same indexer. A backend is made unhealthy the way the health monitor does it
(its failure recorded, the sessions rebuilt), and headless Chromium renders the page.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from html.parser import HTMLParser
from typing import Any

import httpx2
import jwt
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from indexer.errors import BackendUnavailable
from router.errors import IndexerUnavailable
from router.frontdoor.auth import AnonymousAuthenticator
from router.observe.latency_window import FindToolLatency
from router.observe.status_page import StatusPage, render
from tests.support.browser import chromium, dump_dom
from tests.support.processes import Proc
from tests.support.routers import LightStack, another_router, light_stack

SECRET = "status-page-secret-of-32-bytes-at-least"
ISSUER = "https://issuer.test"
WAIT = 30.0
BROKEN = "Cocktails"
ERROR = "connection refused <b>by</b> the test"  # markup in an error must show as text


VOID = {"meta", "link", "br", "img", "input", "hr"}  # HTML elements without an end tag


class Page(HTMLParser):
    """Tables by the heading above them, elements by id, and the chart's shapes, from a DOM."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.texts: dict[str, str] = {}  # element id -> its text
        self.attributes: dict[str, dict[str, str]] = {}  # element id -> its attributes
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.tooltips: list[str] = []  # the texts of <title> elements inside the body (the chart's)
        self._heading = ""
        self._in_heading = False
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._open: list[tuple[str, str]] = []  # (tag, id) of the elements open here
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        self.tags.append((tag, attributes))
        if tag == "h2":
            self._in_heading, self._heading = True, ""
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        if tag not in VOID:
            self._open.append((tag, attributes.get("id", "")))
        if "id" in attributes:
            self.texts[attributes["id"]] = ""
            self.attributes[attributes["id"]] = attributes

    def handle_endtag(self, tag: str) -> None:
        if any(open_tag == tag for open_tag, _ in self._open):
            while self._open.pop()[0] != tag:
                pass
        if tag == "h2":
            self._in_heading = False
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables.setdefault(self._heading, []).append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._in_heading:
            self._heading += data
        if self._cell is not None:
            self._cell.append(data)
        if self._open and self._open[-1][0] == "title" and len(self._open) > 1:
            self.tooltips.append(data)
        for _, element in self._open:
            if element:
                self.texts[element] += data

    def rows(self, heading: str) -> dict[str, list[str]]:
        """The table under the heading that starts with `heading`, keyed by its first column."""
        table = next(rows for title, rows in self.tables.items() if title.startswith(heading))
        return {row[0]: row[1:] for row in table[1:]}


def token(subject: str) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": subject, "aud": "toolsearch", "iat": now, "exp": now + 300}
    return jwt.encode(claims, SECRET, algorithm="HS256")


class Stack:
    def __init__(self, light: LightStack, open_router: Proc, open_url: str) -> None:
        self.light = light
        self.open_router = open_router
        self.open_url = open_url


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    auth = {"mode": "jwt", "issuer": ISSUER, "audience": "toolsearch", "hs256_secret_env": "STATUS_JWT"}
    env = {"STATUS_JWT": SECRET}
    async with light_stack(tmp_path_factory.mktemp("status"), router={"auth": auth}, env=env) as light:
        anonymous = {"auth": {"mode": "anonymous"}}
        proc, url = await asyncio.to_thread(another_router, light, "open", anonymous, env)
        try:
            yield Stack(light, proc, url)
        finally:
            await asyncio.to_thread(proc.stop)


@asynccontextmanager
async def session(url: str, finds: int) -> AsyncIterator[str]:
    """A session on the router at `url` that made `finds` find_tool calls, open while in the block."""
    seen: set[str] = set()

    async def note(response: httpx2.Response) -> None:
        if session_id := response.headers.get("mcp-session-id"):
            seen.add(session_id)

    http = httpx2.AsyncClient(timeout=WAIT, event_hooks={"response": [note]})
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy") as client:
        for _ in range(finds):
            found = await client.call_tool("find_tool", {"tool_description": "a cocktail recipe with rum"})
            assert not found.is_error
        (session_id,) = seen
        yield session_id


async def break_backend(light: LightStack) -> None:
    """What the health monitor does when a probe fails: the verdict recorded, the sessions moved."""
    indexer = light.indexer
    indexer.registry.record_failure(BROKEN, BackendUnavailable(BROKEN, ERROR), "unhealthy")
    indexer.rebuilder.request(f"backend {BROKEN} unhealthy")
    await asyncio.wait_for(indexer.rebuilder.idle(), WAIT)


async def test_the_page_in_a_browser_shows_health_versions_swaps_counters_and_the_latency_chart(
    stack: Stack,
) -> None:
    chromium()  # skipped before any work when the browser is missing
    async with session(stack.open_url, 3) as session_id:
        await break_backend(stack.light)
        page = Page(await asyncio.to_thread(dump_dom, f"{stack.open_url}/status"))
    backends = page.rows("Backends")
    assert backends[BROKEN][0] == "unhealthy" and backends[BROKEN][-1] == ERROR
    assert backends["Free_NBA"][0] == "healthy" and int(backends["Free_NBA"][1]) > 0
    assert not any(tag == "b" for tag, _ in page.tags)  # the error's markup stayed text
    versions = page.rows("Index versions")
    assert sum(int(row[1]) for row in versions.values()) >= 1  # the open session holds one
    swaps = page.tables["Recent swaps"][1:]
    assert any(row[1] == f"backend {BROKEN} unhealthy" and int(row[3]) >= 1 for row in swaps), swaps
    assert int(page.texts["texts-embedded"]) > 0
    chart = page.attributes["latency-chart"]
    assert "median" in chart["aria-label"] and "p95" in chart["aria-label"]
    # every find_tool call is in one bar or another (3 of them, unless a 30 s slice ended between)
    assert sum(int(tip.split(" calls")[0]) for tip in page.tooltips if " calls: " in tip) == 3
    bars = [a for tag, a in page.tags if tag == "rect" and a.get("class") == "p50"]
    assert len(bars) >= 1 and all(float(a["height"]) >= 0 for a in bars)
    assert any(tag == "polyline" and a.get("class") == "p95" for tag, a in page.tags)
    assert session_id and session_id[:8] not in "".join(page.texts.values())


async def test_the_json_view_holds_the_same_figures(stack: Stack) -> None:
    async with session(stack.open_url, 2), httpx2.AsyncClient(timeout=WAIT) as http:
        answer = await http.get(f"{stack.open_url}/status.json")
    assert answer.status_code == 200
    view: dict[str, Any] = answer.json()
    indexer = view["indexer"]
    assert {b["id"] for b in indexer["backends"]} >= {BROKEN, "Free_NBA"}
    assert sum(v["sessions"] for v in indexer["versions"]) == indexer["sessions"]
    assert indexer["embedding"]["texts_embedded"] > 0
    assert "url" not in indexer["backends"][0]
    latency = view["router"]["find_tool_latency"]
    assert sum(b["calls"] for b in latency["buckets"]) >= 2
    assert len(latency["buckets"]) == latency["window_seconds"] / latency["bucket_seconds"]


async def test_with_jwt_auth_both_views_need_a_valid_token(stack: Stack) -> None:
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        for path in ("/status", "/status.json"):
            refused = await http.get(f"{stack.light.router_url}{path}")
            assert refused.status_code == 401, path
            assert refused.headers["www-authenticate"].startswith("Bearer")
            forged = await http.get(
                f"{stack.light.router_url}{path}", headers={"Authorization": "Bearer x.y.z"}
            )
            assert forged.status_code == 401, path
            allowed = await http.get(
                f"{stack.light.router_url}{path}", headers={"Authorization": f"Bearer {token('carol')}"}
            )
            assert allowed.status_code == 200, path


class DownIndexer:
    async def status(self) -> Any:
        raise IndexerUnavailable("no indexer answered")


async def test_without_an_indexer_both_views_answer_503_and_say_why() -> None:
    page = StatusPage(AnonymousAuthenticator(), FindToolLatency())
    view, code = await page.snapshot(DownIndexer())  # type: ignore[arg-type]
    assert code == 503 and view["indexer"] is None
    assert "no indexer answered" in render(view)
    assert "no find_tool calls in this window" in render(view)


# The latency window itself, on a clock the test moves


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_the_window_gives_each_slice_its_median_p95_and_max() -> None:
    clock = Clock()
    window = FindToolLatency(window=60, bucket=30, clock=clock)
    for ms in range(1, 101):  # 1..100 ms in the current slice
        window.observe({"tool": "find_tool", "ms": float(ms)})
    window.observe({"tool": "call_tool", "ms": 9999.0})  # only find_tool is charted
    older, current = window.buckets()
    assert older.calls == 0
    assert (current.calls, current.p50_ms, current.p95_ms, current.max_ms) == (100, 50.0, 95.0, 100.0)


def test_calls_older_than_the_window_leave_it_and_a_burst_is_bounded() -> None:
    clock = Clock()
    window = FindToolLatency(window=60, bucket=30, max_samples=10, clock=clock)
    window.record(5.0)
    clock.now += 61
    assert sum(b.calls for b in window.buckets()) == 0
    for _ in range(25):
        window.record(1.0)
    assert sum(b.calls for b in window.buckets()) == 10
