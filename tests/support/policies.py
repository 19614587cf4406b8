"""Policies for the authorization tests: written to a file beside a test, or compiled from text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from indexer.authorization.authorizer import Authorizer
from indexer.authorization.entities import read_entities
from indexer.authorization.policies import Policy, compile_policy, load_policy
from indexer.authorization.source import Source
from toolsearch.sections.authorization_settings import Authorization

POLICY_FILE = Path("policies.cedar")


def compiled(
    text: str, entities: list[dict[str, Any]] | None = None, tmp: Path | None = None, **options: Any
) -> Policy:
    """A policy from text (and entities, written to `tmp` to be read as a file would be)."""
    entities_file = None
    if entities is not None:
        assert tmp is not None, "entities are read from a file: pass tmp"
        entities_file = tmp / "entities.json"
        entities_file.write_text(json.dumps(entities), encoding="utf-8")
    settings = Authorization(policies=POLICY_FILE, entities_file=entities_file, **options)
    static = read_entities(entities_file) if entities_file is not None else None
    if static is None:
        return compile_policy(Source(POLICY_FILE, text), settings)
    return compile_policy(Source(POLICY_FILE, text), settings, static)


def authorizer(text: str, **options: Any) -> Authorizer:
    return Authorizer(compiled(text, **options))


def written(tmp: Path, text: str, **options: Any) -> Authorization:
    """Settings naming a policy file written in `tmp`."""
    path = tmp / "policies.cedar"
    path.write_text(text, encoding="utf-8")
    return Authorization(policies=path, **options)


def loaded(tmp: Path, text: str, **options: Any) -> Policy:
    return load_policy(written(tmp, text, **options))
