"""The catalog server, served from the test's process and spoken to with the MCP SDK's client.

What its command does as a process (the line it announces, exit codes, its log) is checked in
tests/system/test_catalog_server_command.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from commands.catalog_server import CatalogServerSettings, create_app
from tests.support.in_process import catalog_server_in_process
from tests.support.tokens import hs256
from toolsearch.catalog import group_by_server, load_catalog
from toolsearch.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SECRET = "a-test-secret-that-is-long-enough-for-hs256"

FORECAST_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "units": {"type": "string", "enum": ["metric", "imperial"]},
    },
    "required": ["city"],
}
EMPTY_SCHEMA = {"type": "object", "properties": {}}


def tool(server: str, name: str, schema: dict[str, Any] = EMPTY_SCHEMA) -> dict[str, Any]:
    title = name.replace("_", " ").capitalize()
    return {
        "id": f"{server}::{title}",
        "server": server,
        "name": name,
        "title": title,
        "description": f"{title} ({server})",
        "inputSchema": schema,
    }


WEATHER = ["get_forecast", "get_current", "get_alerts", "get_history", "get_air_quality"]
CATALOG = [
    tool("Weather Service", name, FORECAST_SCHEMA if name == "get_forecast" else EMPTY_SCHEMA)
    for name in WEATHER
] + [
    tool("Secure Notes", "read_note"),
    tool("Flaky Maps", "geocode"),
    tool("Changing Tools", "list_items"),
]


@dataclass(frozen=True)
class Running:
    base: str

    def mcp(self, slug: str) -> str:
        return f"{self.base}/servers/{slug}/mcp"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    path = tmp_path_factory.mktemp("catalog") / "catalog.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in CATALOG))
    settings = CatalogServerSettings(
        page_size=2,
        require_jwt=frozenset({"Secure Notes"}),
        jwt_secret=SECRET,
        allowed_subjects=frozenset({"alice"}),
        control=True,
    )
    with catalog_server_in_process(path, settings) as base:
        yield Running(base)


def token(subject: str = "alice", expires_in: int = 300, secret: str = SECRET) -> str:
    return hs256(secret, subject, expires_in)


@contextlib.asynccontextmanager
async def connect(
    url: str, bearer: str | None = None, mode: Literal["legacy", "auto"] = "legacy"
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else None
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        yield client


async def raw_list(url: str, headers: dict[str, str] | None = None) -> httpx2.Response:
    """A bare tools/list POST, to see the HTTP status the SDK client would fold into an error."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(url, json=body, headers={**accept, **(headers or {})})


async def control(server: Running, path: str) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(f"{server.base}/control/servers/{path}")


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content)


async def all_tools(client: Client) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        assert len(page.tools) <= 2
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            return tools


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_server_lists_all_its_tools_across_pages(
    server: Running, mode: Literal["legacy", "auto"]
) -> None:
    async with connect(server.mcp("Weather_Service"), mode=mode) as client:
        tools = await all_tools(client)
    assert [t.name for t in tools] == WEATHER
    forecast = tools[0]
    assert forecast.title == "Get forecast"
    assert forecast.description == "Get forecast (Weather Service)"
    assert forecast.input_schema == FORECAST_SCHEMA


async def test_a_valid_call_echoes_the_tool_the_server_and_the_arguments(server: Running) -> None:
    arguments = {"city": "Lyon", "days": 3, "units": "metric"}
    async with connect(server.mcp("Weather_Service")) as client:
        result = await client.call_tool("get_forecast", arguments)
    expected = {"tool": "get_forecast", "server": "Weather Service", "arguments": arguments}
    assert not result.is_error
    assert result.structured_content == expected
    assert json.loads(text_of(result)) == expected


async def test_invalid_arguments_give_an_error_result_naming_the_field(server: Running) -> None:
    async with connect(server.mcp("Weather_Service")) as client:
        missing = await client.call_tool("get_forecast", {"days": 3})
        wrong = await client.call_tool("get_forecast", {"city": "Lyon", "units": "kelvin"})
        too_many = await client.call_tool("get_forecast", {"city": "Lyon", "days": 40})
    assert missing.is_error
    assert text_of(missing) == "invalid arguments for get_forecast: 'city' is a required property"
    assert wrong.is_error
    assert text_of(wrong).startswith(
        "invalid arguments for get_forecast: field 'units': 'kelvin' is not one of"
    )
    assert too_many.is_error
    assert "field 'days'" in text_of(too_many)


async def test_an_unknown_tool_gives_an_error_result_naming_it(server: Running) -> None:
    async with connect(server.mcp("Weather_Service")) as client:
        result = await client.call_tool("get_tides", {})
    assert result.is_error
    assert "unknown tool 'get_tides'" in text_of(result)


@pytest.mark.parametrize("cursor", ["not-a-cursor", "99", "-1", "\u00b2", "9" * 5000])
async def test_a_cursor_the_server_did_not_issue_is_a_protocol_error(server: Running, cursor: str) -> None:
    async with connect(server.mcp("Weather_Service")) as client:
        with pytest.raises(MCPError) as info:
            await client.list_tools(cursor=cursor)
    assert info.value.code == INVALID_PARAMS
    assert "invalid cursor" in info.value.message


async def test_an_unknown_server_answers_404_with_a_json_message(server: Running) -> None:
    response = await raw_list(server.mcp("No_Such_Server"))
    assert response.status_code == 404
    assert "unknown server 'No_Such_Server'" in response.json()["error"]["message"]


async def test_a_jwt_server_answers_401_without_a_token(server: Running) -> None:
    response = await raw_list(server.mcp("Secure_Notes"))
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    ("authorization", "problem"),
    [
        (f"Bearer {token(expires_in=-60)}", "the token has expired"),
        (f"Bearer {token(secret='another-secret-that-is-also-long-enough')}", "signature does not verify"),
        ("Bearer not-a-jwt", "not a well-formed JWT"),
        (f"Basic {token()}", "must be Bearer"),
    ],
    ids=["expired", "bad-signature", "malformed", "wrong-scheme"],
)
async def test_a_jwt_server_answers_401_to_a_bad_token(
    server: Running, authorization: str, problem: str
) -> None:
    response = await raw_list(server.mcp("Secure_Notes"), {"Authorization": authorization})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert problem in response.json()["error"]["message"]


async def test_a_jwt_server_answers_403_to_a_subject_not_allowed(server: Running) -> None:
    response = await raw_list(server.mcp("Secure_Notes"), {"Authorization": f"Bearer {token('mallory')}"})
    assert response.status_code == 403
    assert "'mallory'" in response.json()["error"]["message"]


async def test_the_subjects_a_jwt_server_lets_in_can_change_while_it_runs(server: Running) -> None:
    url = f"{server.base}/control/servers/Secure_Notes/subjects"
    as_bob = {"Authorization": f"Bearer {token('bob')}"}
    async with httpx2.AsyncClient(timeout=10) as http:
        try:
            allowed = (await http.post(url, json=["bob", "alice"])).json()["allowed_subjects"]
            assert allowed == ["alice", "bob"]
            assert (await raw_list(server.mcp("Secure_Notes"), as_bob)).status_code == 200
            assert (await http.post(url, json=["alice"])).status_code == 200
            assert (await raw_list(server.mcp("Secure_Notes"), as_bob)).status_code == 403
            assert (await http.post(url, content="null")).json()["allowed_subjects"] is None
            assert (await raw_list(server.mcp("Secure_Notes"), as_bob)).status_code == 200
            other = await http.post(f"{server.base}/control/servers/Flaky_Maps/subjects", json=["bob"])
            assert other.status_code == 400 and "requires no JWT" in other.json()["error"]
            bad = await http.post(url, json={"sub": "bob"})
            assert bad.status_code == 400 and "list of subjects" in bad.json()["error"]
        finally:
            await http.post(url, json=["alice"])  # as the fixture started it


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_jwt_server_serves_a_good_token(server: Running, mode: Literal["legacy", "auto"]) -> None:
    async with connect(server.mcp("Secure_Notes"), bearer=token(), mode=mode) as client:
        tools = await all_tools(client)
        result = await client.call_tool("read_note", {})
    assert [t.name for t in tools] == ["read_note"]
    assert result.structured_content == {"tool": "read_note", "server": "Secure Notes", "arguments": {}}


async def test_a_server_without_jwt_ignores_other_servers_requirements(server: Running) -> None:
    response = await raw_list(server.mcp("Flaky_Maps"))
    assert response.status_code == 200


async def test_a_server_taken_down_answers_503_and_serves_again_once_up(server: Running) -> None:
    assert (await control(server, "Flaky_Maps/down")).json()["down"] is True
    try:
        response = await raw_list(server.mcp("Flaky_Maps"))
        assert response.status_code == 503
        assert "is down" in response.json()["error"]["message"]
        assert (await raw_list(server.mcp("Weather_Service"))).status_code == 200
    finally:
        assert (await control(server, "Flaky_Maps/up")).json()["down"] is False
    async with connect(server.mcp("Flaky_Maps")) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["geocode"]


async def test_a_slow_server_delays_its_answers_until_set_back_to_zero(server: Running) -> None:
    assert (await control(server, "Flaky_Maps/slow?seconds=0.5")).json()["delay_seconds"] == 0.5
    try:
        started = time.monotonic()
        assert (await raw_list(server.mcp("Flaky_Maps"))).status_code == 200
        assert time.monotonic() - started >= 0.5
    finally:
        await control(server, "Flaky_Maps/slow?seconds=0")
    async with httpx2.AsyncClient(timeout=10) as http:
        state = (await http.get(f"{server.base}/control/servers")).json()
    assert {s["slug"]: s["delay_seconds"] for s in state["servers"]}["Flaky_Maps"] == 0


async def test_a_stalled_server_hangs_its_calls_while_its_listings_answer(server: Running) -> None:
    assert (await control(server, "Flaky_Maps/stall?seconds=60")).json()["call_delay_seconds"] == 60
    try:
        async with connect(server.mcp("Flaky_Maps")) as client:
            with anyio.fail_after(30):  # long before the stall would end
                assert [t.name for t in await all_tools(client)] == ["geocode"]
            with pytest.raises(TimeoutError), anyio.fail_after(1):
                await client.call_tool("geocode", {})
    finally:
        await control(server, "Flaky_Maps/stall?seconds=0")
    async with connect(server.mcp("Flaky_Maps")) as client:
        with anyio.fail_after(30):
            assert not (await client.call_tool("geocode", {})).is_error


async def test_posting_tools_replaces_a_servers_tool_list(server: Running) -> None:
    new_tools = [
        {"name": "add_item", "description": "Add an item", "inputSchema": FORECAST_SCHEMA},
        {"name": "remove_item", "description": "Remove an item", "inputSchema": EMPTY_SCHEMA},
    ]
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(f"{server.base}/control/servers/Changing_Tools/tools", json=new_tools)
    assert response.status_code == 200
    assert response.json()["tools"] == 2
    async with connect(server.mcp("Changing_Tools")) as client:
        assert [t.name for t in await all_tools(client)] == ["add_item", "remove_item"]
        gone = await client.call_tool("list_items", {})
        added = await client.call_tool("add_item", {})
    assert gone.is_error
    assert text_of(added) == "invalid arguments for add_item: 'city' is a required property"


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("No_Such_Server/down", None, 404, "unknown server"),
        ("Flaky_Maps/slow?seconds=-1", None, 400, "seconds must be between"),
        ("Flaky_Maps/slow", None, 400, "?seconds=X"),
        ("Flaky_Maps/stall?seconds=nan", None, 400, "seconds must be between"),
        ("Flaky_Maps/explode", None, 404, "unknown control action"),
        ("Flaky_Maps/garble?as=xml", None, 400, "?as=json, ?as=html, or ?as=off"),
        ("Changing_Tools/tools", {"name": "x"}, 400, "JSON list"),
        ("Changing_Tools/tools", [{"description": "no name"}], 400, "'name'"),
        ("Changing_Tools/tools", [{"name": "x", "inputSchema": {"type": 5}}], 400, "not valid JSON Schema"),
    ],
)
async def test_control_requests_that_make_no_sense_get_a_clear_error(
    server: Running, path: str, body: Any, status: int, message: str
) -> None:
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(f"{server.base}/control/servers/{path}", json=body)
    assert response.status_code == status
    assert message in response.json()["error"]


def test_the_example_catalog_has_at_least_200_tools_in_20_servers_with_valid_schemas() -> None:
    catalog = load_catalog(ROOT / "examples" / "catalog.jsonl")
    servers = group_by_server(catalog)
    assert len(catalog) >= 200
    assert len(servers) >= 20
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", slug) for slug in servers)
    create_app(catalog, CatalogServerSettings())  # every schema compiles
    assert "Apache License" in (ROOT / "examples" / "LICENSE").read_text().splitlines()[0]


def test_the_demo_config_registers_every_example_server_as_a_backend() -> None:
    config = load_config(ROOT / "examples" / "demo.yaml", env={})
    slugs = set(group_by_server(load_catalog(ROOT / "examples" / "catalog.jsonl")))
    assert {backend.id for backend in config.backends} == slugs
    assert all(backend.url.endswith(f"/servers/{backend.id}/mcp") for backend in config.backends)
    assert config.router.listen == "127.0.0.1:8000"
    assert config.indexer.listen == "127.0.0.1:50051"
