"""The one rule that makes names unique across backends: tool names, resource URIs, prompt names.

The indexer names a session's tools with it (indexer/retrieval/tools.py) and the router names the resources,
resource templates and prompts it aggregates with it (router/handlers/offerings.py), under the same
`indexer.naming` settings, so a client meets one rule for everything toolsearch carries: a name that
only one backend uses keeps it; every backend's copy of a shared name becomes
`<backend><separator><name>` (with `always`, every name does).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

Prefix = Literal["on_collision", "always"]


class Named(NamedTuple):
    """One backend's entry under the name it is advertised by."""

    backend_id: str
    position: int  # where the entry is in that backend's own list
    original: str  # the backend's own name for it, used when forwarding
    name: str  # the advertised name: unique across the backends named together


def prefixed(backend_id: str, name: str, separator: str) -> str:
    """A backend's own name with the backend's prefix, as a collision names it."""
    return f"{backend_id}{separator}{name}"


def advertised_names(
    names: Mapping[str, Sequence[str]], prefix: Prefix = "on_collision", separator: str = "_"
) -> list[Named]:
    """Name every entry of the given backends uniquely, in backend order then each backend's order.

    A backend that lists one name twice keeps its first, and a prefixed name that equals another
    entry's name is left out rather than shadowing it: names are decided per set of backends, so
    adding a backend can rename another's entry, and forwarding always goes by the mapping this
    returns, never by taking a name apart.
    """
    counts = Counter(name for own in names.values() for name in dict.fromkeys(own))
    named: list[Named] = []
    taken: set[str] = set()
    for backend_id in sorted(names):
        for position, original in enumerate(names[backend_id]):
            name = original
            if prefix == "always" or counts[original] > 1:
                name = prefixed(backend_id, original, separator)
            if name in taken:
                continue
            taken.add(name)
            named.append(Named(backend_id, position, original, name))
    return named
