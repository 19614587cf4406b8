"""`toolsearch catalog-server` as a process: the line it announces once ready, its exit codes for a
bad start, and a log that never holds a token. What it serves is checked in process, in
tests/operations/test_catalog_server.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.catalog_server import DEFAULT_SECRET_ENV as SECRET_ENV
from commands.ports import free_port
from tests.support.catalogs import small_catalog
from tests.support.processes import start_process
from tests.support.stack import DEMO_CATALOG, HEADERS
from tests.support.tokens import hs256
from toolsearch.catalog import server_slug

SECRET = "a-test-secret-that-is-long-enough-for-hs256"
COMMAND = [sys.executable, "-m", "commands.cli", "catalog-server"]


def a_tool_line() -> str:
    """One valid line of a catalog file."""
    return DEMO_CATALOG.read_text(encoding="utf-8").splitlines()[0]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != SECRET_ENV} | (env or {})
    return subprocess.run(
        [*COMMAND, *args], capture_output=True, text=True, timeout=60, env=environment, check=False
    )


def test_the_server_announces_its_address_and_size_when_ready(tmp_path: Path) -> None:
    names = small_catalog(tmp_path / "catalog.jsonl")
    port = free_port()
    args = [*COMMAND, "--catalog", str(tmp_path / "catalog.jsonl"), "--port", str(port)]
    with start_process(args, f"http://127.0.0.1:{port}/healthz") as proc:
        size = f"{len(names)} servers, {sum(len(tools) for tools in names.values())} tools"
        assert f"catalog server listening on http://127.0.0.1:{port} ({size})" in proc.output()


def test_a_bad_catalog_file_exits_2_naming_the_line_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(a_tool_line() + "\n{not json\n")
    done = run_cli("--catalog", str(path), "--port", str(free_port()))
    assert done.returncode == 2
    assert f"{path}:2: not JSON" in done.stderr
    assert "Traceback" not in done.stderr


def test_requiring_a_jwt_without_the_secret_in_the_environment_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "catalog.jsonl"
    path.write_text(a_tool_line() + "\n")
    missing = run_cli("--catalog", str(path), "--require-jwt", "*")
    short = run_cli("--catalog", str(path), "--require-jwt", "*", env={SECRET_ENV: "short"})
    unknown = run_cli("--catalog", str(path), "--require-jwt", "Nowhere", env={SECRET_ENV: SECRET})
    assert (missing.returncode, short.returncode, unknown.returncode) == (2, 2, 2)
    assert SECRET_ENV in missing.stderr
    assert "at least 32 bytes" in short.stderr
    assert "Nowhere" in unknown.stderr
    assert "Traceback" not in missing.stderr + short.stderr + unknown.stderr


async def test_tokens_never_reach_the_log_even_at_debug_level(tmp_path: Path) -> None:
    path = tmp_path / "catalog.jsonl"
    tool = json.loads(a_tool_line())
    path.write_text(json.dumps(tool) + "\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}/servers/{server_slug(tool['server'])}/mcp"
    args = [
        *COMMAND,
        "--catalog",
        str(path),
        "--port",
        str(port),
        "--require-jwt",
        "*",
        "--log-level",
        "debug",
    ]
    proc = start_process(args, f"http://127.0.0.1:{port}/healthz", env={SECRET_ENV: SECRET})
    good, expired = hs256(SECRET, "alice", 300), hs256(SECRET, "alice", -60)
    try:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {good}"}, timeout=30) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            await client.call_tool(tool["name"], {})
            refused = await http.post(
                url,
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                headers={**HEADERS, "Authorization": f"Bearer {expired}"},
            )
            assert refused.status_code == 401
    finally:
        output = proc.stop()
    assert "catalog server listening on" in output
    assert good not in output
    assert expired not in output
    assert SECRET not in output
