"""The MCP server lists other clients write, read as backends: `backends_from` in the configuration.

Claude Desktop and Cursor keep `{"mcpServers": {NAME: ENTRY}}`, VS Code keeps `{"servers": {NAME:
ENTRY}}`. An ENTRY is a stdio server (`command`, `args`, `env`, `cwd`) or a remote one (`url`,
`headers`), and `type` may say which (`stdio`, `http`, `streamable-http`, `sse`). Each becomes one
backend whose id is NAME made safe; its `timeout` is the backend's (seconds, as Cline and Roo Code
write it; a value over 3600 is milliseconds, as Gemini CLI writes it). Keys that only matter to the
client that wrote the file (`autoApprove`, `alwaysAllow`, `trust`, `dev`, `description`; VS Code's
top-level `inputs`; every key beside the server list) are ignored, and the ones an entry had are named
in one log line per file. What cannot be carried over is an error naming the file, the entry and
the key, never silently dropped:

- `${input:...}`, VS Code's prompted input: nobody is there to answer a prompt;
- a header value that is not exactly one environment variable (`${NAME}` or `${env:NAME}`): secrets
  never live in the configuration, and one header from one variable is what a backend's auth sends;
- any other key: it may change what the server does or what the agent may call (`envFile`,
  `includeTools`, ...), which toolsearch would not honour.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class ServersFileError(ValueError):
    """A server list that cannot be read or imported; the message names the file, entry and key."""


_KINDS = {
    "stdio": "stdio",
    "http": "streamable_http",
    "streamable-http": "streamable_http",
    "streamableHttp": "streamable_http",
    "sse": "sse",
}
_STDIO_KEYS = frozenset({"command", "args", "env", "cwd"})
_REMOTE_KEYS = frozenset({"url", "headers"})
# what only the client that wrote the file acts on: approvals, trust prompts, its own dev mode, notes
_CLIENT_KEYS = frozenset({"autoApprove", "alwaysAllow", "trust", "dev", "description"})
_KNOWN_KEYS = _STDIO_KEYS | _REMOTE_KEYS | _CLIENT_KEYS | {"type", "transportType", "disabled", "timeout"}
MAX_TIMEOUT_SECONDS = 3600  # Cline's largest timeout: a larger value is Gemini CLI's milliseconds
# ${env:NAME} is VS Code's and Cursor's spelling of what the configuration writes ${NAME}
_ENV_VARIABLE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)\}")
_ANY_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class ImportedServer:
    """One server of a file, as a raw backend entry of the configuration."""

    where: str  # e.g. mcpServers.github: the entry, for messages
    backend: dict[str, Any]


def backend_id(name: str) -> str:
    """A server's name as a backend id: runs of other characters become "-", at most 64 characters."""
    return _UNSAFE.sub("-", name).strip("-")[:64]


def read_servers_file(path: Path) -> list[ImportedServer]:
    """Every enabled server of an mcpServers (or VS Code `servers`) JSON file; raises `ServersFileError`."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ServersFileError(f"{path}: cannot read the server list ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ServersFileError(f"{path}: not valid JSON ({exc}); comments are not supported") from None
    if not isinstance(document, dict):
        raise ServersFileError(f"{path}: the top level must be an object with mcpServers or servers")
    # prompted inputs are refused where an entry uses one (${input:...}); the list alone is harmless
    ignored = ["inputs"] if document.get("inputs") else []
    lists = [(key, document[key]) for key in ("mcpServers", "servers") if key in document]
    if not lists:
        raise ServersFileError(f"{path}: no mcpServers (Claude Desktop, Cursor) or servers (VS Code) object")
    imported: list[ImportedServer] = []
    names: dict[str, str] = {}
    for key, servers in lists:
        if not isinstance(servers, dict):
            raise ServersFileError(f"{path}: {key}: must be an object of servers by name")
        for name, entry in servers.items():
            where = f"{key}.{name}"
            server = _server(path, where, name, entry)
            if server is None:
                continue
            if (other := names.get(server.backend["id"])) is not None:
                raise ServersFileError(
                    f"{path}: {where}: its backend id {server.backend['id']!r} is also {other}'s: rename one"
                )
            names[server.backend["id"]] = where
            imported.append(server)
            ignored += [f"{where}.{key}" for key in sorted(set(entry) & _CLIENT_KEYS)]
    if ignored:
        logger.info("%s: ignored what only its client acts on: %s", path, ", ".join(ignored))
    return imported


def _kind(entry: Mapping[str, Any], fail: Callable[[str, str], ServersFileError]) -> str:
    """The transport an entry names (`type`; Cline's and Roo Code's `transportType`), or implies."""
    kind = entry.get("type", entry.get("transportType", "stdio" if "command" in entry else "streamable_http"))
    if kind not in _KINDS.values() and kind not in _KINDS:
        raise fail("type", f"unknown type {kind!r} (stdio, http, streamable-http or sse)")
    return str(_KINDS.get(kind, kind))


def _server(path: Path, where: str, name: str, entry: object) -> ImportedServer | None:
    def fail(key: str, message: str) -> ServersFileError:
        return ServersFileError(f"{path}: {where}{'.' + key if key else ''}: {message}")

    if not isinstance(entry, dict):
        raise fail("", "must be an object (command, args, env, cwd, or url, headers)")
    if unknown := sorted(set(entry) - _KNOWN_KEYS):
        known = "type, command, args, env, cwd, url, headers, timeout"
        raise fail(
            unknown[0], f"cannot be imported (known: {known}; ignored: {', '.join(sorted(_CLIENT_KEYS))})"
        )
    if entry.get("disabled") is True:
        return None
    ident = backend_id(name)
    if not ident:
        raise fail("", "the name has no letter or digit to make a backend id of")
    kind = _kind(entry, fail)
    backend: dict[str, Any] = {"id": ident}
    if "timeout" in entry:
        backend["timeout"] = _seconds(entry["timeout"])
    if kind == "stdio":
        if stray := sorted(set(entry) & _REMOTE_KEYS):
            raise fail(stray[0], "a stdio server (command) takes command, args, env and cwd")
        for key in ("command", "args", "env", "cwd"):
            if key in entry:
                backend[key] = entry[key]
        for index, arg in _strings(entry.get("args")):
            if _ANY_VARIABLE.search(arg):
                raise fail(f"args.{index}", "variables are substituted in env values only")
        if isinstance(env := entry.get("env"), Mapping):
            backend["env"] = {}
            for key, value in env.items():
                if (problem := _env_problem(value)) is not None:
                    raise fail(f"env.{key}", problem)
                backend["env"][key] = _ENV_VARIABLE.sub(_plain, value) if isinstance(value, str) else value
        if isinstance(cwd := entry.get("cwd"), str):
            if _ANY_VARIABLE.search(cwd):
                raise fail("cwd", "variables such as ${workspaceFolder} cannot be resolved here")
            backend["cwd"] = str(path.parent / cwd) if not Path(cwd).is_absolute() else cwd
        return ImportedServer(where, backend)
    if stray := sorted(set(entry) & _STDIO_KEYS):
        raise fail(stray[0], "a remote server (url) takes url and headers")
    if "url" not in entry:
        raise fail("url", "missing: a remote server needs its url")
    backend["url"] = entry["url"]
    if kind == "sse":
        backend["transport"] = "sse"
    headers = entry.get("headers") or {}
    if not isinstance(headers, dict):
        raise fail("headers", "must be an object of header names and values")
    if len(headers) > 1:
        raise fail("headers", "at most one header can be imported (a backend sends one credential)")
    for header, value in headers.items():
        match = _ENV_VARIABLE.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise fail(
                f"headers.{header}",
                "the value must be exactly one environment variable, ${NAME} (secrets never live in "
                "the configuration): put the whole header value in that variable",
            )
        backend["auth"] = {"type": "header", "header": header, "value_env": match.group(1)}
    return ImportedServer(where, backend)


def _seconds(timeout: object) -> object:
    """A client's timeout in seconds: a value over `MAX_TIMEOUT_SECONDS` is in milliseconds."""
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > MAX_TIMEOUT_SECONDS:
        return timeout / 1000
    return timeout  # validation names a wrong type


def _strings(value: object) -> list[tuple[int, str]]:
    return [(i, v) for i, v in enumerate(value) if isinstance(v, str)] if isinstance(value, list) else []


def _plain(match: re.Match[str]) -> str:
    return "${" + match.group(1) + "}"


def _env_problem(value: object) -> str | None:
    """What keeps an env value from being imported: a variable other than an environment one."""
    if not isinstance(value, str):
        return None  # validation names the wrong type
    for match in _ANY_VARIABLE.finditer(value):
        inner = match.group(1)
        if inner.startswith("input:"):
            return "prompted inputs cannot be imported: use an environment variable, ${env:NAME}"
        if not _ENV_VARIABLE.fullmatch(match.group(0)):
            return f"${{{inner}}} cannot be resolved here: only environment variables, ${{env:NAME}}"
    return None
