"""What a principal may be shown or may call: tools, prompts and resources, each as a Cedar entity.

An item is named as the session names it (`Tool::"<name>"` with the name find_tool gives the tool,
`Prompt::"<name>"`, `Resource::"<sanitized uri>"`), is a child of its backend's `MCP::"<id>"`, and
has ToolHive's attributes: `name`, `operation`, `feature` (`uri` for a resource, whose `name` is the
URI as written, as ToolHive sets it), the tool annotations its server set (`readOnlyHint`, ...),
and `backend`, the backend's id, which ToolHive lacks. A call adds its arguments (`arg_<key>`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from indexer.authorization.expressions import Uid
from indexer.authorization.vocabulary import (
    BACKEND,
    HINTS,
    OPERATIONS,
    RESOURCE_TYPES,
    SERVER,
    Kind,
    argument_attributes,
    sanitize_uri,
)


@dataclass(frozen=True, slots=True)
class Item:
    """A tool, prompt or resource one backend offers, under the name a session gives it."""

    kind: Kind
    name: str  # a tool's or prompt's name as the session names it; a resource's URI
    backend: str
    hints: tuple[tuple[str, bool], ...] = ()  # the tool annotations the server set, in HINTS order

    @classmethod
    def tool(cls, name: str, backend: str, annotations: Mapping[str, Any] | None = None) -> Item:
        """A tool, with the annotations of its definition that are set (booleans only, as MCP's)."""
        given = annotations or {}
        return cls(
            "tool", name, backend, tuple((h, given[h]) for h in HINTS if isinstance(given.get(h), bool))
        )

    @classmethod
    def prompt(cls, name: str, backend: str) -> Item:
        return cls("prompt", name, backend)

    @classmethod
    def resource(cls, uri: str, backend: str) -> Item:
        return cls("resource", uri, backend)

    @property
    def uid(self) -> Uid:
        return RESOURCE_TYPES[self.kind], sanitize_uri(self.name) if self.kind == "resource" else self.name

    @property
    def server(self) -> Uid:
        return SERVER, self.backend

    def attributes(self, arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The entity's attributes: hints, then arguments, then ToolHive's own names (which win)."""
        own: dict[str, Any] = {"name": self.name, "operation": OPERATIONS[self.kind], "feature": self.kind}
        if self.kind == "resource":
            own["uri"] = self.name
        own[BACKEND] = self.backend
        return {**dict(self.hints), **argument_attributes(arguments), **own}

    def entity(self, arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The item as a Cedar entity (JSON form), child of its backend."""
        kind, name = self.uid
        return {
            "uid": {"type": kind, "id": name},
            "attrs": self.attributes(arguments),
            "parents": [{"type": SERVER, "id": self.backend}],
        }


class Catalog:
    """The items a question is asked of, in a fixed order, and a fingerprint of them."""

    def __init__(self, items: Iterable[Item]) -> None:
        self.items: tuple[Item, ...] = tuple(dict.fromkeys(items))

    def __len__(self) -> int:
        return len(self.items)

    @cached_property
    def fingerprint(self) -> str:
        listed = sorted([item.kind, item.name, item.backend, item.hints] for item in self.items)
        return hashlib.sha256(json.dumps(listed, separators=(",", ":")).encode()).hexdigest()

    @cached_property
    def positions(self) -> dict[Item, int]:
        """Each item's place in the catalog's order."""
        return {item: index for index, item in enumerate(self.items)}
