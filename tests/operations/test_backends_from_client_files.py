"""`backends_from`: the server lists Claude Desktop, Cursor and VS Code keep, read as backends.

Also the configuration of stdio and SSE backends themselves: exactly one of url and command, the
keys each kind may use, and the url a stdio backend gets from the bridge section.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.transports.process import LaunchError, launch_of
from toolsearch.config import ConfigError, load_config

CLAUDE_DESKTOP = {
    "mcpServers": {
        "filesystem": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"],
        },
        "GitHub Issues": {
            "command": "docker",
            "args": ["run", "-i", "--rm", "ghcr.io/github/github-mcp-server"],
            "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "${env:GITHUB_TOKEN}", "LOG": "quiet"},
            "cwd": "work",
        },
        "remote": {"url": "https://mcp.example.com/sse", "type": "sse"},
        "old": {"command": "old-server", "disabled": True},
    },
    "globalShortcut": "Ctrl+Space",  # a setting of the client's own: not a server, ignored
}
VS_CODE = {
    "servers": {
        "time": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"]},
        "docs": {
            "type": "http",
            "url": "https://docs.example.com/mcp",
            "headers": {"Authorization": "${env:DOCS_TOKEN}"},
        },
    }
}


def configure(folder: Path, config: dict[str, Any], **files: dict[str, Any]) -> Path:
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content))
    path = folder / "toolsearch.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def problem(path: Path) -> str:
    with pytest.raises(ConfigError) as failure:
        load_config(path)
    return str(failure.value)


def test_a_claude_desktop_file_becomes_stdio_and_remote_backends(tmp_path: Path) -> None:
    path = configure(
        tmp_path,
        {"bridge": {"listen": "127.0.0.1:9300"}, "backends_from": "claude.json"},
        **{"claude.json": CLAUDE_DESKTOP},
    )
    backends = {b.id: b for b in load_config(path).backends}
    assert set(backends) == {"filesystem", "GitHub-Issues", "remote"}  # a disabled one is left out
    files = backends["filesystem"]
    assert files.command == "npx" and files.args[:2] == ["-y", "@modelcontextprotocol/server-filesystem"]
    assert files.url == "http://127.0.0.1:9300/filesystem/mcp"  # the bridge serves it
    github = backends["GitHub-Issues"]
    assert github.env == {"GITHUB_PERSONAL_ACCESS_TOKEN": "${GITHUB_TOKEN}", "LOG": "quiet"}
    assert github.cwd == tmp_path / "work"  # relative to the file that says it
    launch = launch_of(github, {"GITHUB_TOKEN": "ghp_secret", "PATH": "/usr/bin"})
    assert launch.env["GITHUB_PERSONAL_ACCESS_TOKEN"] == "ghp_secret"
    assert launch.env["PATH"] == "/usr/bin"
    assert "ghp_secret" not in launch.describe()
    remote = backends["remote"]
    assert (remote.sse_url, remote.command) == ("https://mcp.example.com/sse", None)
    # a legacy SSE server: the bridge holds its sessions, and everything else reaches it there
    assert (remote.url, remote.transport) == ("http://127.0.0.1:9300/remote/mcp", "streamable_http")


def test_a_vs_code_file_becomes_backends_with_a_header_from_the_environment(tmp_path: Path) -> None:
    path = configure(tmp_path, {"backends_from": ["mcp.json"]}, **{"mcp.json": VS_CODE})
    backends = {b.id: b for b in load_config(path).backends}
    assert backends["time"].command == "uvx"
    assert backends["time"].url == "http://127.0.0.1:9200/time/mcp"  # the default bridge.listen
    docs = backends["docs"]
    assert (docs.url, docs.transport) == ("https://docs.example.com/mcp", "streamable_http")
    assert (docs.auth.type, docs.auth.header, docs.auth.value_env) == (
        "header",
        "Authorization",
        "DOCS_TOKEN",
    )


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"command": "x", "envFile": ".env"}, "mcpServers.bad.envFile: cannot be imported"),
        ({"command": "x", "includeTools": ["read"]}, "mcpServers.bad.includeTools: cannot be imported"),
        ({"command": "x", "timeout": "soon"}, "mcpServers.bad.timeout: Input should be a valid number"),
        ({"command": "x", "url": "https://x"}, "mcpServers.bad.url: a stdio server (command) takes"),
        ({"command": "x", "env": {"T": "${input:token}"}}, "mcpServers.bad.env.T: prompted inputs"),
        ({"command": "x", "cwd": "${workspaceFolder}"}, "mcpServers.bad.cwd: variables such as"),
        (
            {"url": "https://x", "headers": {"Authorization": "Bearer abc"}},
            "headers.Authorization: the value",
        ),
        ({"type": "websocket", "url": "wss://x"}, "mcpServers.bad.type: unknown type 'websocket'"),
        ({"command": "x", "args": "not-a-list"}, "mcpServers.bad.args: Input should be a valid list"),
        ({"type": "stdio"}, "mcpServers.bad.url: needs url (an HTTP MCP endpoint) or command"),
    ],
)
def test_a_key_that_cannot_be_mapped_names_the_file_the_entry_and_the_key(
    tmp_path: Path, entry: dict[str, Any], expected: str
) -> None:
    path = configure(
        tmp_path, {"backends_from": "claude.json"}, **{"claude.json": {"mcpServers": {"bad": entry}}}
    )
    message = problem(path)
    assert message.startswith(f"{tmp_path / 'claude.json'}: "), message
    assert expected in message, message


def test_a_vs_code_input_an_entry_uses_is_refused_clearly(tmp_path: Path) -> None:
    servers = {"time": {"command": "uvx", "env": {"TOKEN": "${input:token}"}}}
    content = {"inputs": [{"type": "promptString", "id": "token", "password": True}], "servers": servers}
    path = configure(tmp_path, {"backends_from": "mcp.json"}, **{"mcp.json": content})
    assert "servers.time.env.TOKEN: prompted inputs cannot be imported" in problem(path)


# Files as the clients write them, with the keys only the client acts on.
CLAUDE_DESKTOP_AS_KEPT = {
    "mcpServers": {
        "memory": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-memory"],
            "autoApprove": ["read_graph"],
            "timeout": 120,
        }
    },
    "globalShortcut": "",
}
VS_CODE_AS_KEPT = {
    "inputs": [],
    "servers": {
        "time": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"], "dev": {"watch": "src/**"}}
    },
}
CURSOR_AS_KEPT = {
    "mcpServers": {
        "docs": {"url": "https://docs.example.com/mcp", "headers": {"Authorization": "${env:DOCS_TOKEN}"}},
        "git": {"command": "uvx", "args": ["mcp-server-git"], "env": {}, "description": "repository tools"},
    }
}
CLINE_AS_KEPT = {
    "mcpServers": {
        "search": {
            "transportType": "sse",
            "url": "https://search.example.com/sse",
            "alwaysAllow": ["search"],
            "disabled": False,
            "timeout": 30,
        }
    }
}
GEMINI_AS_KEPT = {
    "mcpServers": {"fetch": {"command": "uvx", "args": ["mcp-server-fetch"], "timeout": 45000, "trust": True}}
}


def test_files_as_clients_keep_them_are_imported_and_the_client_keys_named_in_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = {
        "claude.json": CLAUDE_DESKTOP_AS_KEPT,
        "mcp.json": VS_CODE_AS_KEPT,
        "cursor.json": CURSOR_AS_KEPT,
        "cline.json": CLINE_AS_KEPT,
        "gemini.json": GEMINI_AS_KEPT,
    }
    path = configure(tmp_path, {"backends_from": list(files)}, **files)
    with caplog.at_level(logging.INFO, logger="toolsearch.sections.mcp_servers"):
        backends = {b.id: b for b in load_config(path).backends}
    assert set(backends) == {"memory", "time", "docs", "git", "search", "fetch"}
    # a per-server timeout is the backend's: seconds, or Gemini CLI's milliseconds
    assert (backends["memory"].timeout, backends["search"].timeout, backends["fetch"].timeout) == (
        120,
        30,
        45,
    )
    assert backends["time"].timeout == 30  # the default, where the file says none
    assert backends["search"].sse_url == "https://search.example.com/sse"
    lines = {r.getMessage().partition(": ")[0]: r.getMessage() for r in caplog.records}
    assert lines == {
        str(tmp_path / "claude.json"): f"{tmp_path / 'claude.json'}: ignored what only its client acts on: "
        "mcpServers.memory.autoApprove",
        str(tmp_path / "mcp.json"): f"{tmp_path / 'mcp.json'}: ignored what only its client acts on: "
        "servers.time.dev",
        str(tmp_path / "cursor.json"): f"{tmp_path / 'cursor.json'}: ignored what only its client acts on: "
        "mcpServers.git.description",
        str(tmp_path / "cline.json"): f"{tmp_path / 'cline.json'}: ignored what only its client acts on: "
        "mcpServers.search.alwaysAllow",
        str(tmp_path / "gemini.json"): f"{tmp_path / 'gemini.json'}: ignored what only its client acts on: "
        "mcpServers.fetch.trust",
    }


def test_an_imported_name_that_clashes_with_a_backend_is_refused(tmp_path: Path) -> None:
    config = {"backends": [{"id": "filesystem", "url": "http://127.0.0.1:9/mcp"}], "backends_from": "c.json"}
    path = configure(tmp_path, config, **{"c.json": CLAUDE_DESKTOP})
    assert "mcpServers.filesystem: backend id 'filesystem' is already in use" in problem(path)


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        ({"command": "x", "url": "http://x/mcp"}, "backends.0.url: url and command: give one"),
        ({}, "backends.0.url: needs url (an HTTP MCP endpoint) or command (a stdio server to run)"),
        ({"url": "http://x/mcp", "args": ["a"]}, "backends.0: args: for stdio backends (command) only"),
        ({"command": "x", "transport": "sse"}, "backends.0: transport: for url backends only"),
        ({"command": "x", "env": {"A": "${not valid}"}}, "backends.0.env: A: write an environment variable"),
        ({"command": "x", "isolation": "per_process"}, "backends.0.isolation: Input should be 'shared'"),
    ],
)
def test_a_backend_is_either_a_url_or_a_command(
    tmp_path: Path, backend: dict[str, Any], expected: str
) -> None:
    path = configure(tmp_path, {"backends": [{"id": "b", **backend}]})
    assert expected in problem(path)


def test_a_stdio_backends_url_follows_the_bridges_address(tmp_path: Path) -> None:
    backends = [{"id": "time", "command": "mcp-server-time"}]
    path = configure(
        tmp_path, {"bridge": {"listen": "0.0.0.0:9300", "url": "http://bridge:9300"}, "backends": backends}
    )
    assert load_config(path).backends[0].url == "http://bridge:9300/time/mcp"
    assert (
        load_config(path, {"TOOLSEARCH_BRIDGE_URL": "http://other:1"}).backends[0].url
        == "http://other:1/time/mcp"
    )
    wildcard = configure(tmp_path, {"bridge": {"listen": "0.0.0.0:9300"}, "backends": backends})
    assert load_config(wildcard).backends[0].url == "http://127.0.0.1:9300/time/mcp"


def test_an_unset_variable_stops_the_bridge_naming_backend_key_and_variable(tmp_path: Path) -> None:
    backends = [{"id": "gh", "command": "server", "env": {"TOKEN": "${GITHUB_TOKEN}"}}]
    (backend,) = load_config(configure(tmp_path, {"backends": backends})).backends
    with pytest.raises(LaunchError) as failure:
        launch_of(backend, {})
    assert str(failure.value) == (
        "backend gh: env.TOKEN names ${GITHUB_TOKEN}, which is not set in the environment of the bridge"
    )
