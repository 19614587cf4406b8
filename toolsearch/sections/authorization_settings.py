"""The authorization section: the Cedar policy file that decides who may find and call what.

docs/authorization.md describes the policies (ToolHive's vocabulary) and docs/configuration.md every
key. Without this section every caller may use every tool; with it, what no policy permits is denied.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from toolsearch.sections.settings import Section

# how often the files are read again: a change is in force within this, plus the check (docs/authorization.md)
DEFAULT_RELOAD_INTERVAL = 5.0


def _claim_name(value: str) -> str:
    if not value or value != value.strip():
        raise ValueError(f"must be a claim name without surrounding spaces, got {value!r}")
    return value


class Authorization(Section):
    """Where the policies are and how a caller's token becomes a Cedar principal (ToolHive's options)."""

    policies: Path  # a Cedar policy file; relative paths resolve against the configuration file's folder
    # Cedar JSON entities merged with the ones each request makes (ToolHive's entities_json), or none
    entities_file: Path | None = None
    # the claim holding the caller's groups, tried before groups, roles and cognito:groups (a.b: nested)
    group_claim_name: str | None = None
    role_claim_name: str | None = None  # a claim whose roles become groups too; none: no role claim
    # claims given both as a space-separated string and a set (claimset_<name>): OAuth scopes
    multi_valued_claims: list[str] = []
    # seconds between two reads of the files; a good change is in force within this and its check
    reload_interval: float = Field(default=DEFAULT_RELOAD_INTERVAL, gt=0, le=60)

    _claims = field_validator("group_claim_name", "role_claim_name")(
        classmethod(lambda cls, v: None if v is None else _claim_name(v))
    )
    _multi = field_validator("multi_valued_claims")(classmethod(lambda cls, v: [_claim_name(c) for c in v]))
