"""`GET /status` (HTML) and `GET /status.json`: what the indexer and this router know, for people.

The indexer's part comes from its Status RPC on each request (read into plain data by
router/link/indexer_answers.py): the backends with their health,
probe latency and last error; the index versions and how many sessions hold each; the recent swaps,
one line per reason and version however many sessions moved (a health change moves thousands at
once); the embedding counters. The router adds find_tool's latency over the last minutes as this
replica saw it (router/observe/latency_window.py), drawn as an inline SVG chart: the page needs no script.

Neither view names a session or a principal, and backend URLs stay out (one may carry a key in its
query). Both are protected like `/mcp`: with `router.auth.mode: jwt` they need a valid bearer token.
When the indexer does not answer, both still answer, with status 503 and the reason.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from router.caller import Authenticator
from router.errors import RouterError, Unauthenticated
from router.link.indexer_answers import iso_time
from router.link.indexer_client import IndexerClient
from router.observe.latency_window import FindToolLatency
from router.observe.status_chart import latency_chart


class StatusPage:
    """Serves `/status` and `/status.json` from the indexer's Status answer and this router's window."""

    def __init__(
        self, authenticator: Authenticator, latency: FindToolLatency, clock: Callable[[], float] = time.time
    ) -> None:
        self.authenticator = authenticator
        self.latency = latency
        self._clock = clock

    def routes(self) -> list[Route]:
        return [
            Route("/status", self.page, methods=["GET"]),
            Route("/status.json", self.data, methods=["GET"]),
        ]

    async def snapshot(self, indexer: IndexerClient) -> tuple[dict[str, Any], int]:
        """Everything both views show, and the HTTP status: 503 when the indexer did not answer."""
        view: dict[str, Any] = {"generated_at": iso_time(self._clock())}
        code = 200
        try:
            view["indexer"] = await indexer.status()
        except RouterError as exc:
            view["indexer"] = None
            view["indexer_error"] = str(exc)
            code = 503
        view["router"] = {
            "find_tool_latency": {
                "window_seconds": self.latency.window,
                "bucket_seconds": self.latency.bucket,
                "buckets": [bucket._asdict() for bucket in self.latency.buckets()],
            }
        }
        return view, code

    async def _refused(self, request: Request) -> Response | None:
        try:
            await self.authenticator.authenticate(request.headers)
        except Unauthenticated as exc:
            body = {"detail": str(exc)}
            return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": exc.www_authenticate})
        return None

    async def data(self, request: Request) -> Response:
        if (refused := await self._refused(request)) is not None:
            return refused
        view, code = await self.snapshot(request.state.indexer)
        return JSONResponse(view, status_code=code)

    async def page(self, request: Request) -> Response:
        if (refused := await self._refused(request)) is not None:
            return refused
        view, code = await self.snapshot(request.state.indexer)
        return HTMLResponse(render(view), status_code=code, headers={"Cache-Control": "no-store"})


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse}th,td{padding:.25em .8em;border-bottom:1px solid #ddd;text-align:left}
td.n{text-align:right}.healthy{color:#17803d}.degraded{color:#a66300}.unhealthy,.unauthenticated{color:#b3261e}
.unknown{color:#666}.error{color:#b3261e}code{font-size:.95em}
"""


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _table(headers: list[str], rows: list[list[str]], numeric: set[int], empty: str) -> str:
    if not rows:
        return f"<p>{_e(empty)}</p>"
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if i in numeric else ''}>{cell}</td>" for i, cell in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(view: dict[str, Any]) -> str:
    """The HTML page of a snapshot; every value from the indexer or a backend is escaped."""
    parts = [f"<h1>toolsearch status</h1><p>generated {_e(view['generated_at'])} (UTC)</p>"]
    indexer = view.get("indexer")
    if indexer is None:
        parts.append(f'<p class="error" id="indexer-error">indexer: {_e(view.get("indexer_error", ""))}</p>')
    else:
        backends = [
            [
                _e(b["id"]),
                f'<span class="{_e(b["status"])}">{_e(b["status"])}</span>',
                _e(b["tools"]),
                f"{b['latency_ms']:.1f}",
                _e(b["circuit"] or "-"),
                _e(b["last_error"] or "-"),
            ]
            for b in indexer["backends"]
        ]
        parts.append("<h2>Backends</h2>")
        headers = ["backend", "health", "tools", "latency ms", "circuit", "last error"]
        parts.append(_table(headers, backends, {2, 3}, "no backends configured"))
        versions = [
            [f"<code>{_e(v['fingerprint'][:16])}</code>", _e(v["tools"]), _e(v["sessions"])]
            for v in indexer["versions"]
        ]
        parts.append(f"<h2>Index versions</h2><p>{_count(indexer['sessions'], 'session')}</p>")
        parts.append(_table(["version", "tools", "sessions"], versions, {1, 2}, "no index versions yet"))
        swaps = [
            [_e(s["at"]), _e(s["reason"]), f"<code>{_e(s['fingerprint'][:16])}</code>", _e(s["sessions"])]
            for s in indexer["swaps"]
        ]
        parts.append("<h2>Recent swaps</h2>")
        parts.append(_table(["at (UTC)", "reason", "new version", "sessions"], swaps, {3}, "no swaps yet"))
        counters = indexer["embedding"]
        parts.append(
            f"<h2>Embedding</h2><p>model <code>{_e(indexer['model'])}</code>: "
            f"<span id=texts-embedded>{_e(counters['texts_embedded'])}</span> texts embedded in "
            f"{_count(counters['model_calls'], 'model call')}, "
            f"{_e(counters['cache_hits'])} from the cache</p>"
        )
        if counters["unavailable"]:
            parts.append(
                f"<p id=embedding-unavailable><strong>Unavailable</strong> since "
                f"{_e(counters['unavailable_since'])} (UTC): {_e(counters['unavailable_reason'])}. "
                "find_tool answers from the lexical arm alone until it is back.</p>"
            )
        if counters["outages"]:
            parts.append(
                f"<p>{_count(counters['outages'], 'outage')} since start; "
                f"{_count(counters['lexical_answers'], 'find_tool answer')} from the lexical arm alone</p>"
            )
    latency = view["router"]["find_tool_latency"]
    minutes = latency["window_seconds"] / 60
    parts.append(f"<h2>find_tool latency, last {minutes:g} minutes (this router)</h2>")
    parts.append(latency_chart(latency["buckets"], latency["bucket_seconds"]))
    body = "\n".join(parts)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>toolsearch status</title><style>{_STYLE}</style></head><body>{body}</body></html>"
    )
