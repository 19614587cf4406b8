"""Close names for a tool name a session does not hold: what call_tool answers a misspelt name with.

A name is compared to every advertised name of the session's current version, and to each tool's
own name at its backend, in the form exact lookups use (`name_key`: lower-case words): by edit
similarity of the whole (difflib's ratio, which forgives a typo or a dropped letter) and by the
share of words the two have in common (which forgives words in another order, or a missing prefix).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from indexer.retrieval.text import name_key
from indexer.retrieval.tools import Tool

MAX_SUGGESTIONS = 3
MIN_SIMILARITY = 0.6  # below it a name is no more like the one asked for than chance makes it


def _similarity(asked: str, words: frozenset[str], candidate: str) -> float:
    matcher = difflib.SequenceMatcher(None, asked, candidate, autojunk=False)
    if matcher.real_quick_ratio() < MIN_SIMILARITY and not words & set(candidate.split("_")):
        return 0.0
    theirs = frozenset(candidate.split("_"))
    overlap = len(words & theirs) / len(words | theirs) if words or theirs else 0.0
    return max(matcher.ratio(), overlap)


def closest_tools(name: str, tools: Sequence[Tool], limit: int = MAX_SUGGESTIONS) -> list[Tool]:
    """The tools whose names are most like `name`, most alike first; none when nothing is close."""
    asked = name_key(name)
    if not asked:
        return []
    words = frozenset(asked.split("_"))
    scored = []
    for tool in tools:
        best = max(
            _similarity(asked, words, name_key(tool.name)),
            _similarity(asked, words, name_key(tool.original_name)),
        )
        if best >= MIN_SIMILARITY:
            scored.append((-best, tool.name, tool))
    return [tool for _, _, tool in sorted(scored, key=lambda s: (s[0], s[1]))[:limit]]


def by_own_name(tools: Sequence[Tool], name: str) -> Tool | None:
    """The one tool a name means when the version advertises it otherwise: `<backend>_<own name>`
    after a collision went away, or its own name while prefixed. Ambiguous names mean none."""
    key = name_key(name)
    found = [
        t for t in tools if key in (name_key(t.original_name), name_key(f"{t.backend_id}_{t.original_name}"))
    ]
    return found[0] if len(found) == 1 else None
