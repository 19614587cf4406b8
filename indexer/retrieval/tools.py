"""Tools under the names a session advertises them by, made unique across backends."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from indexer.state.listings import ServerInfo
from toolsearch.answers import estimate_tokens
from toolsearch.naming import Prefix, advertised_names


@dataclass(frozen=True, slots=True)
class Tool:
    """One backend tool, as a session sees it."""

    name: str  # the advertised name: unique within a session's catalog
    original_name: str  # the backend's own name, used when calling it
    backend_id: str
    definition: Mapping[str, Any]  # the backend's definition, as it listed it
    definition_json: str  # the advertised definition (name replaced), serialised once
    input_schema_json: str
    tokens: int
    server: ServerInfo = field(default_factory=ServerInfo)  # what its server said of itself, shared

    @property
    def input_schema(self) -> Mapping[str, Any]:
        schema = self.definition.get("inputSchema")
        return schema if isinstance(schema, Mapping) else {"type": "object"}


def make_tool(
    backend_id: str, definition: Mapping[str, Any], name: str, server: ServerInfo | None = None
) -> Tool:
    """A tool advertised under `name`; `server` is what its server said of itself."""
    advertised = dict(definition)
    advertised["name"] = name
    text = json.dumps(advertised, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    schema = definition.get("inputSchema")
    return Tool(
        name=name,
        original_name=str(definition["name"]),
        backend_id=backend_id,
        definition=definition,
        definition_json=text,
        input_schema_json=json.dumps(schema if isinstance(schema, Mapping) else {"type": "object"}),
        tokens=estimate_tokens(text),
        server=server or ServerInfo(),
    )


def advertise(
    listings: Mapping[str, Sequence[Mapping[str, Any]]],
    prefix: Prefix = "on_collision",
    separator: str = "_",
    servers: Mapping[str, ServerInfo] | None = None,
) -> list[Tool]:
    """Name every tool of the given backends uniquely, in backend order then listing order.

    The rule is toolsearch/naming.py's, shared with the resources and prompts the router carries:
    with `on_collision`, a name that only one backend uses keeps it; every backend's copy of a
    shared name becomes `<backend><separator><name>`. Names are decided per catalog, so adding a
    backend can rename another's tool; `call_tool` resolves within the session's current version,
    and the backend's own name is always an exact-match alias for `find_tool`.
    """
    names = {
        backend_id: [str(d["name"]) for d in definitions] for backend_id, definitions in listings.items()
    }
    return [
        make_tool(
            named.backend_id,
            listings[named.backend_id][named.position],
            named.name,
            (servers or {}).get(named.backend_id),
        )
        for named in advertised_names(names, prefix, separator)
    ]
