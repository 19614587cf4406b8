"""Custom static entities (`authorization.entities_file`, ToolHive's `entities_json`): entities with
attributes and parents of their own, merged with the ones each request makes.

The file is a JSON array of Cedar entities. Besides Cedar's uid forms (`{"type": "Tool", "id":
"weather"}`, `{"__entity": {...}}`), ToolHive's string form (`"Tool::weather"` or `'Tool::"weather"'`)
is read, and `attrs` and `parents` may be left out. An entity a request makes too (the caller's
`Client`, a `Tool`) is merged with it: the file's attributes under the request's own (`name`,
`operation`, `feature`, the hints, `arg_*` and `claim_*` always win), the parents of both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import cedarpy

from indexer.authorization.expressions import Uid, entities_in
from indexer.authorization.source import PolicyError
from indexer.authorization.vocabulary import ACTION, RESOURCE_TYPES


def uid_of(value: Any) -> Uid | None:
    """A uid in any form the file may write it, or None."""
    if isinstance(value, Mapping) and "__entity" in value:
        value = value["__entity"]
    if isinstance(value, Mapping) and isinstance(value.get("type"), str) and isinstance(value.get("id"), str):
        return value["type"], value["id"]
    if isinstance(value, str) and "::" in value:
        kind, _, name = value.rpartition("::")
        if len(name) >= 2 and name[0] == name[-1] == '"':
            name = json.loads(name)
        return (kind, name) if kind else None
    return None


def as_json(uid: Uid) -> dict[str, str]:
    return {"type": uid[0], "id": uid[1]}


@dataclass(frozen=True)
class StaticEntities:
    """The file's entities by uid, each `{"attrs": ..., "parents": [...]}` in Cedar's JSON form."""

    by_uid: Mapping[Uid, Mapping[str, Any]] = field(default_factory=dict)
    text: str = "[]"  # the entities as one canonical JSON text: part of the policy's fingerprint

    @cached_property
    def reach_items(self) -> bool:
        """Whether a tool, prompt or resource is some entity's parent or attribute value here: then
        what one item holds can matter to a question about another."""
        items = set(RESOURCE_TYPES.values())
        for entity in self.by_uid.values():
            parents = (uid_of(parent) for parent in entity["parents"])
            if any(p is not None and p[0] in items for p in parents):
                return True
            if any(kind in items for kind, _ in entities_in(entity["attrs"])):
                return True
        return False

    @property
    def types(self) -> frozenset[str]:
        return frozenset(kind for kind, _ in self.by_uid)

    def attributes_of(self, types: Iterable[str]) -> frozenset[str]:
        """The attribute names the file gives entities of these types."""
        wanted = set(types)
        return frozenset(
            name for (kind, _), e in self.by_uid.items() if kind in wanted for name in e["attrs"]
        )

    def ancestors(self, parents: Iterable[Uid]) -> frozenset[Uid]:
        """Every entity above these parents: themselves and, through the file's parents, theirs."""
        seen: set[Uid] = set()
        waiting = list(parents)
        while waiting:
            uid = waiting.pop()
            if uid not in seen:
                seen.add(uid)
                waiting += [uid_of(p) or ("", "") for p in self.by_uid.get(uid, {}).get("parents", [])]
        return frozenset(seen)

    def merged(self, entity: Mapping[str, Any]) -> dict[str, Any]:
        """A request's entity with the file's entity of the same uid under it."""
        uid = uid_of(entity["uid"])
        static = self.by_uid.get(uid) if uid is not None else None
        if static is None:
            return dict(entity)
        parents = list(static["parents"]) + [p for p in entity["parents"] if p not in static["parents"]]
        return {"uid": entity["uid"], "attrs": {**static["attrs"], **entity["attrs"]}, "parents": parents}

    def others(self, made: Iterable[Uid]) -> list[dict[str, Any]]:
        """The file's entities a request does not make itself."""
        skip = set(made)
        return [{"uid": as_json(uid), **e} for uid, e in self.by_uid.items() if uid not in skip]


NO_ENTITIES = StaticEntities()


def read_entities(path: Path) -> StaticEntities:
    """Read and check an entities file; a bad one raises `PolicyError` naming it and the entity."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read the entities file ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f"{exc.lineno}:{exc.colno}: " if isinstance(exc, json.JSONDecodeError) else ""
        raise PolicyError(f"{path}:{where}not a JSON array of Cedar entities ({exc})") from None
    if not isinstance(raw, list):
        raise PolicyError(f"{path}: must be a JSON array of Cedar entities, as ToolHive's entities_json")
    by_uid: dict[Uid, dict[str, Any]] = {}
    for index, entity in enumerate(raw):
        uid = uid_of(entity.get("uid")) if isinstance(entity, Mapping) else None
        where = f"{path}: entity {index}"
        if uid is None:
            raise PolicyError(f'{where}: needs a "uid" such as {{"type": "Tool", "id": "weather"}}')
        if uid in by_uid:
            raise PolicyError(f"{where}: {uid[0]}::{json.dumps(uid[1])} is given twice")
        if uid[0] == ACTION:
            raise PolicyError(
                f"{where}: actions are call_tool, get_prompt and read_resource, not entities to write"
            )
        attrs, parents = entity.get("attrs", {}), entity.get("parents", [])
        if not isinstance(attrs, Mapping) or not isinstance(parents, list):
            raise PolicyError(f'{where}: "attrs" must be an object and "parents" a list of uids')
        parent_uids = [uid_of(parent) for parent in parents]
        if any(parent is None for parent in parent_uids):
            raise PolicyError(f"{where}: a parent is not a uid")
        by_uid[uid] = {"attrs": dict(attrs), "parents": [as_json(p) for p in parent_uids if p is not None]}
    entities = StaticEntities(by_uid, json.dumps(_listed(by_uid), sort_keys=True, separators=(",", ":")))
    try:
        cedarpy.Entities.from_json_str(entities.text)
    except ValueError as exc:
        raise PolicyError(f"{path}: Cedar refuses these entities: {exc}") from None
    return entities


def _listed(by_uid: Mapping[Uid, Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"uid": as_json(uid), **entity} for uid, entity in sorted(by_uid.items())]
