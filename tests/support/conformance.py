"""The official MCP conformance suite (`@modelcontextprotocol/conformance`, npm), run against a URL,
and the test servers it runs against: the project's own (Python SDK) and the same on the TypeScript SDK.

    outcomes = await run_suite(url, "2025-11-25", folder)  # {scenario: Outcome}

The suite's `server` command runs each server scenario of a requirement set in turn and leaves one
folder per scenario with its checks (`checks.json`); a scenario passes when none of its checks
failed. It comes from tests/servers (installed by `make setup`); without Node or the package the
tests that need it are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commands.ports import free_port
from tests.support.conformance_content import handshake_content
from tests.support.conformance_server import conformance_app
from tests.support.in_process import hosted, serve_app
from tests.support.processes import start_process
from tests.support.stack import ROOT

SERVERS = ROOT / "tests" / "servers"
SUITE = SERVERS / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
TYPESCRIPT_SERVER = SERVERS / "conformance-server.mjs"  # the same server, on the TypeScript SDK
REQUIREMENTS = ("2025-11-25", "2026-07-28")
RUN_TIMEOUT = 600.0  # seconds for one requirement set's run; each scenario has the suite's own 30 s
DETAILS_SHOWN = 600  # characters of a failed check's details in its message
LIST_TIMEOUT = 120.0  # seconds for the suite to list a requirement set's scenarios
_LISTED: dict[str, list[str]] = {}  # each requirement set's scenarios, once listed


@contextlib.contextmanager
def conformance_server(host: str = "127.0.0.1", modern_only: bool = False) -> Iterator[str]:
    """The project's conformance test server (tests/support/conformance_server.py) as a process on
    loopback: its MCP URL, under `host` (it answers to 127.0.0.1 and localhost); with `modern_only`,
    refusing the initialize handshake."""
    port = free_port()
    args = [sys.executable, "-m", "tests.support.conformance_server", str(port)]
    if modern_only:
        args.append("modern")
    with start_process(args, f"http://127.0.0.1:{port}/healthz", cwd=ROOT):
        yield f"http://{host}:{port}/mcp"


@contextlib.contextmanager
def conformance_server_in_process(modern_only: bool = False) -> Iterator[str]:
    """The same server served from the test's process, on a loop of its own: its MCP URL."""
    port = free_port()
    listen = f"127.0.0.1:{port}"
    with hosted(functools.partial(serve_app, conformance_app(port, modern_only), listen)):
        yield f"http://{listen}/mcp"


def typescript_server_args(folder: Path, where: str) -> list[str]:
    """The command of the TypeScript SDK's conformance server (tests/servers/conformance-server.mjs)
    listening on `where` (a port, or `stdio`), its content written to `folder`."""
    content = folder / "conformance-content.json"
    content.write_text(json.dumps(handshake_content()))
    return ["node", str(TYPESCRIPT_SERVER), where, str(content)]


@contextlib.contextmanager
def typescript_conformance_server(folder: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """The TypeScript SDK's conformance server as a process on loopback: its MCP URL, under `host`."""
    port = free_port()
    with start_process(typescript_server_args(folder, str(port)), f"http://127.0.0.1:{port}/healthz"):
        yield f"http://{host}:{port}/mcp"


def missing() -> str | None:
    """Why the suite cannot run here, or None when it can."""
    if shutil.which("node") is None:
        return "node is not installed: the conformance suite cannot run"
    if not SUITE.exists():
        return "the conformance suite is not installed (make setup installs tests/servers)"
    return None


@dataclass(frozen=True)
class Outcome:
    """One scenario's result: whether it passed, the messages of the checks that failed, and the
    ids of those that passed with a warning (a SHOULD not met)."""

    passed: bool
    failures: tuple[str, ...]
    warnings: tuple[str, ...] = ()


async def _node(*args: str, timeout: float) -> str:
    process = await asyncio.create_subprocess_exec(
        "node", str(SUITE), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        raise AssertionError(f"the conformance suite ({' '.join(args[:2])}) ran over {timeout:g}s") from None
    finally:
        # over time, or cancelled because a run beside it failed: no suite outlives its run
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await asyncio.shield(process.wait())
    return output.decode(errors="replace")


async def server_scenarios(requirements: str) -> list[str]:
    """The server scenarios a requirement set requires, as the suite lists them: listed once a
    process, so that runs started together do not each start Node for the same list first."""
    if requirements not in _LISTED:
        listing = await _node("list", "--server", "--requirements", requirements, timeout=LIST_TIMEOUT)
        _LISTED[requirements] = _scenarios_in(listing)
    return list(_LISTED[requirements])


def _scenarios_in(listing: str) -> list[str]:
    names: list[str] = []
    section = False
    for line in listing.splitlines():
        if line.startswith("Server scenarios"):
            section = True
        elif section and line.strip().startswith("- "):
            names.append(line.strip()[2:])
        elif section and names and not line.strip():
            break
    return names


def _outcome(folder: Path) -> Outcome:
    checks = json.loads((folder / "checks.json").read_text())
    failed = [c for c in checks if c.get("status") == "FAILURE"]
    warned = tuple(str(c.get("id")) for c in checks if c.get("status") == "WARNING")
    return Outcome(not failed, tuple(_failure(c) for c in failed), warned)


def _failure(check: dict[str, Any]) -> str:
    """A failed check as its id and message, with what the suite saw (its details, cut short), so
    that a failure says what came back and not only that something did."""
    seen = json.dumps(check["details"], sort_keys=True)[:DETAILS_SHOWN] if check.get("details") else ""
    return f"{check.get('id')}: {check.get('errorMessage', '')}" + (f" (saw {seen})" if seen else "")


async def run_suite(url: str, requirements: str, folder: Path) -> dict[str, Outcome]:
    """Every server scenario of `requirements` against `url`; each required one's outcome by name.

    A required scenario that left no checks (the suite could not run it) counts as failed.
    """
    required = await server_scenarios(requirements)
    output = await _node(
        "server", "--url", url, "--requirements", requirements, "-o", str(folder), timeout=RUN_TIMEOUT
    )
    return _collected(folder, required, output)


async def run_scenario(url: str, scenario: str, spec_version: str, folder: Path) -> Outcome:
    """One server scenario against `url`, whichever suite it is in (a pending one, too)."""
    output = await _node(
        "server",
        "--url",
        url,
        "--scenario",
        scenario,
        "--spec-version",
        spec_version,
        "-o",
        str(folder),
        timeout=RUN_TIMEOUT,
    )
    return _collected(folder, [scenario], output)[scenario]


def _collected(folder: Path, required: list[str], output: str) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    for name in required:
        # each scenario's folder is server-<name>-<timestamp>: a digit follows the name's dash
        found = [
            f for f in folder.glob(f"server-{name}-*") if f.name[len(name) + 8 : len(name) + 9].isdigit()
        ]
        if found and (found[0] / "checks.json").exists():
            outcomes[name] = _outcome(found[0])
        else:
            outcomes[name] = Outcome(False, (f"the suite left no checks; its output:\n{output[-2000:]}",))
    return outcomes
