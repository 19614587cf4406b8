"""The catalog server's control API: what a test or a demo may do to the servers it serves.

`ServedServer` is one served server's tools and the state the API changes (down, slow, stalled,
garbled, padded, its tools and subjects replaced); `Control` answers the `/control` routes
(commands/catalog_server.py lists them). Without authentication: keep it on loopback.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from toolsearch.catalog import CatalogError, CatalogTool, input_validator, parse_tool

MAX_DELAY_SECONDS = 600.0
MAX_PAD_BYTES = 256 * 1024 * 1024


@dataclass(slots=True)
class ServedServer:
    """One served server: its tools and what the control API has done to it."""

    slug: str
    server: str
    # name -> (definition, argument validator); replaced as a whole, so a request sees one list
    tools: dict[str, tuple[types.Tool, Any]]
    requires_jwt: bool
    allowed_subjects: frozenset[str] | None = None  # when set, the only `sub` values let in
    down: bool = False
    delay: float = 0.0
    call_delay: float = 0.0  # seconds every tools/call result waits besides `delay`
    pad: int = 0  # bytes every tools/call result carries in addition
    garble: str = ""  # "json" or "html": every MCP request answered with that, unreadable
    calls: int = 0  # tools/call requests that reached this server's handler
    requests: int = 0  # MCP requests received, counted on arrival (before the delay)

    def state(self) -> dict[str, Any]:
        return {
            "slug": self.slug,
            "server": self.server,
            "tools": len(self.tools),
            "down": self.down,
            "delay_seconds": self.delay,
            "call_delay_seconds": self.call_delay,
            "pad_bytes": self.pad,
            "garble": self.garble or None,
            "calls": self.calls,
            "requests": self.requests,
            "requires_jwt": self.requires_jwt,
            "allowed_subjects": None if self.allowed_subjects is None else sorted(self.allowed_subjects),
        }


# what a garbled server answers: JSON cut short, and the error page of a proxy in front of it
GARBLED = {
    "json": Response(
        '{"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "cut', media_type="application/json"
    ),
    "html": Response(
        "<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>",
        media_type="text/html",
    ),
}


def _delay(request: Request) -> float:
    """The `?seconds=X` of a slow or stall control request; 400 unless it is a bounded number."""
    try:
        seconds = float(request.query_params["seconds"])
    except (KeyError, ValueError):
        raise HTTPException(400, "give the delay as ?seconds=X") from None
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_DELAY_SECONDS:
        raise HTTPException(400, f"seconds must be between 0 and {MAX_DELAY_SECONDS:g}")
    return seconds


def clip(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def prepare_tools(tools: list[CatalogTool]) -> dict[str, tuple[types.Tool, Any]]:
    """Check every tool once, so a bad schema fails when it is loaded, not when it is called."""
    prepared: dict[str, tuple[types.Tool, Any]] = {}
    for tool in tools:
        if tool.name in prepared:
            raise CatalogError(f"tool {tool.name!r} appears twice in server {tool.server!r}")
        try:
            definition = types.Tool.model_validate(tool.definition())
        except ValidationError as exc:
            raise CatalogError(
                f"tool {tool.name!r}: not a valid MCP tool ({exc.errors()[0]['msg']})"
            ) from None
        prepared[tool.name] = (definition, input_validator(tool))
    return prepared


class Control:
    """The `/control` routes over the served servers, by slug."""

    def __init__(self, backends: dict[str, ServedServer]) -> None:
        self.backends = backends

    async def state(self, request: Request) -> Response:
        """`GET /control/servers`: every served server's state."""
        return JSONResponse({"servers": [backend.state() for backend in self.backends.values()]})

    async def calls(self, request: Request) -> Response:
        """`GET /control/servers/{slug}/calls`: the tools/call requests handled, the requests received."""
        backend = self.backends.get(request.path_params["slug"])
        if backend is None:
            raise HTTPException(404, f"unknown server {clip(request.path_params['slug'])}")
        return JSONResponse({"slug": backend.slug, "calls": backend.calls, "requests": backend.requests})

    async def act(self, request: Request) -> Response:
        """`POST /control/servers/{slug}/{down,up,slow,stall,garble,pad,tools,subjects}`."""
        backend = self.backends.get(request.path_params["slug"])
        if backend is None:
            raise HTTPException(404, f"unknown server {clip(request.path_params['slug'])}")
        action = request.path_params["action"]
        if action in ("down", "up"):
            backend.down = action == "down"
        elif action == "slow":
            backend.delay = _delay(request)
        elif action == "stall":
            backend.call_delay = _delay(request)
        elif action == "garble":
            kind = request.query_params.get("as", "")
            if kind not in (*GARBLED, "off"):
                raise HTTPException(400, "give what to answer as ?as=json, ?as=html, or ?as=off to end it")
            backend.garble = "" if kind == "off" else kind
        elif action == "pad":
            size = request.query_params.get("bytes", "")
            if not size.isdigit() or int(size) > MAX_PAD_BYTES:
                raise HTTPException(400, f"give the padding as ?bytes=N, 0 to {MAX_PAD_BYTES}")
            backend.pad = int(size)
        elif action == "tools":
            backend.tools = await _posted_tools(request, backend.server)
        elif action == "subjects":
            if not backend.requires_jwt:
                raise HTTPException(
                    400, f"server {backend.server!r} requires no JWT: it has no subjects to allow"
                )
            backend.allowed_subjects = await _posted_subjects(request)
        else:
            raise HTTPException(
                404,
                f"unknown control action {clip(action)}: down, up, slow, stall, garble, pad, tools or "
                "subjects",
            )
        return JSONResponse(backend.state())


async def _posted_subjects(request: Request) -> frozenset[str] | None:
    """The subjects of a control request's body: a JSON list of strings, or null for every subject."""
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HTTPException(400, f"the body must be JSON ({exc})") from None
    if body is None:
        return None
    if not isinstance(body, list) or not all(isinstance(item, str) for item in body):
        raise HTTPException(400, "the body must be a JSON list of subjects, or null to let every subject in")
    return frozenset(body)


async def _posted_tools(request: Request, server: str) -> dict[str, tuple[types.Tool, Any]]:
    """The tools of a control request's body: a list of definitions, or a tools/list result."""
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HTTPException(400, f"the body must be JSON ({exc})") from None
    if isinstance(body, dict) and isinstance(body.get("tools"), list):
        body = body["tools"]
    if not isinstance(body, list) or not all(isinstance(item, dict) for item in body):
        raise HTTPException(400, "the body must be a JSON list of tool definitions")
    try:
        return prepare_tools(
            [parse_tool(json.dumps({**item, "server": server}), f"tools[{i}]") for i, item in enumerate(body)]
        )
    except CatalogError as exc:
        raise HTTPException(400, str(exc)) from None
