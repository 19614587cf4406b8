"""Catalog files: MCP-shaped tools in JSON Lines, grouped by the server they belong to.

One tool a line, as in the public evaluation sets::

    {"id": "weather::get_forecast", "server": "weather", "name": "get_forecast",
     "title": "Get forecast", "description": "...", "inputSchema": {"type": "object", ...}}

The catalog server serves every server of a file as its own MCP endpoint and checks call arguments
with `input_validator` and `argument_problem`; `toolsearch eval` searches a whole file in process; a
config can register each server of a file as a backend.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, best_match

# the public evaluation sets shipped with the package: catalogs and labelled queries (README there)
EVAL_DATA = Path(__file__).resolve().parent / "data" / "eval"
TRAIN_DATA = EVAL_DATA.parent / "train"  # the training corpus, shipped beside the evaluation sets
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
DEFAULT_SERVER = "default"
_MAX_MESSAGE = 300  # a validation message quotes the offending value, which can be long


class CatalogError(ValueError):
    """Raised when a catalog file cannot be read or a line is not a tool."""


@dataclass(frozen=True, slots=True)
class CatalogTool:
    """One tool of a catalog file."""

    id: str
    server: str
    name: str
    description: str
    input_schema: dict[str, Any]
    title: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def server_slug(self) -> str:
        return server_slug(self.server)

    def definition(self) -> dict[str, Any]:
        """The MCP tool definition, as a server's tools/list would send it."""
        out: dict[str, Any] = {"name": self.name}
        if self.title:
            out["title"] = self.title
        out["description"] = self.description
        out["inputSchema"] = self.input_schema
        return out


def server_slug(server: str) -> str:
    """A URL- and id-safe name for a server: runs of other characters become one underscore."""
    slug = _UNSAFE.sub("_", server).strip("_")
    return slug or DEFAULT_SERVER


def parse_tool(line: str, where: str) -> CatalogTool:
    """Parse one catalog line; `where` names the place for error messages."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CatalogError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: a tool must be a JSON object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise CatalogError(f"{where}: 'name' must be a non-empty string")
    schema = raw.get("inputSchema", {"type": "object", "properties": {}})
    if not isinstance(schema, dict):
        raise CatalogError(f"{where}: 'inputSchema' must be an object")
    server = raw.get("server", "")
    description = raw.get("description", "")
    title = raw.get("title")
    if not isinstance(server, str) or not isinstance(description, str):
        raise CatalogError(f"{where}: 'server' and 'description' must be strings")
    if title is not None and not isinstance(title, str):
        raise CatalogError(f"{where}: 'title' must be a string")
    tool_id = raw.get("id") or f"{server}::{name}"
    known = {"id", "server", "name", "title", "description", "inputSchema"}
    extra = {k: v for k, v in raw.items() if k not in known}
    return CatalogTool(
        id=str(tool_id),
        server=server,
        name=name,
        description=description,
        input_schema=schema,
        title=title,
        extra=extra,
    )


def load_catalog(path: Path) -> list[CatalogTool]:
    """Read every tool of a catalog file, failing with the line number of the first bad line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read catalog ({exc.strerror})") from None
    tools = [
        parse_tool(line, f"{path}:{number}")
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    seen: set[tuple[str, str]] = set()
    for tool in tools:
        key = (tool.server_slug, tool.name)
        if key in seen:
            raise CatalogError(f"{path}: tool {tool.name!r} appears twice in server {tool.server!r}")
        seen.add(key)
    return tools


def group_by_server(tools: Iterable[CatalogTool]) -> dict[str, list[CatalogTool]]:
    """Tools by server slug, in file order."""
    servers: dict[str, list[CatalogTool]] = {}
    for tool in tools:
        servers.setdefault(tool.server_slug, []).append(tool)
    return servers


def input_validator(tool: CatalogTool) -> Any:
    """A jsonschema validator for the tool's inputSchema (its `$schema` draft, else 2020-12).

    Raises CatalogError when the schema itself is not valid JSON Schema.
    """
    cls = validators.validator_for(tool.input_schema, default=Draft202012Validator)
    try:
        cls.check_schema(tool.input_schema)
    except SchemaError as exc:
        where = f"tool {tool.name!r} of server {tool.server!r}"
        raise CatalogError(f"{where}: inputSchema is not valid JSON Schema ({exc.message})") from None
    return cls(tool.input_schema)


def argument_problem(validator: Any, arguments: Mapping[str, Any]) -> str | None:
    """What is most wrong with `arguments`, naming the field; None when they are valid."""
    error = best_match(validator.iter_errors(arguments))
    if error is None:
        return None
    message = (
        error.message if len(error.message) <= _MAX_MESSAGE else error.message[: _MAX_MESSAGE - 3] + "..."
    )
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    return f"field {path!r}: {message}" if path else message
