"""What the session's backends offer beside tools, under the names a client sees, and back again.

Resources (by URI), resource templates (by URI template) and prompts (by name) of several backends
are named with the rule tool names follow (toolsearch/naming.py, under the indexer's
`indexer.naming`): a URI or name only one backend offers keeps it; each backend's copy of a shared
one becomes `<backend><separator><own>`, e.g. `everything_simple-prompt`. Forwarding goes the
other way (`resolve`), looking for what the client asked in this order:

1. an advertised name (or a URI an advertised template matches), concrete resources before
   templates;
2. `<backend><separator><own>` for any reachable backend, advertised or not (a collision that has
   gone away leaves the prefixed form working);
3. a backend's own name, when exactly one backend has it.

A step that finds several backends is ambiguous: the client is told which prefixed forms to use.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from toolsearch.naming import Prefix, advertised_names, prefixed

_EXPRESSION = re.compile(r"\{([^}]*)\}")


@functools.lru_cache(maxsize=1024)
def template_pattern(template: str) -> re.Pattern[str]:
    """A regular expression for the URIs an RFC 6570 template expands to (loosely: for ownership).

    `{x}` is one path segment, `{+x}` and `{#x}` anything, `{?x,y}` and `{&x}` an optional query.
    """
    parts: list[str] = []
    last = 0
    for match in _EXPRESSION.finditer(template):
        parts.append(re.escape(template[last : match.start()]))
        operator = match.group(1)[:1]
        if operator in ("+", "#"):
            parts.append(".*")
        elif operator in ("?", "&"):
            parts.append(r"(?:[?&].*)?")
        else:
            parts.append(r"[^/?#]*")
        last = match.end()
    parts.append(re.escape(template[last:]))
    return re.compile("".join(parts))


@dataclass(frozen=True, slots=True)
class Offering:
    """One backend's resource, template or prompt, under its advertised name."""

    backend_id: str
    original: str  # the backend's own URI, URI template or name
    name: str  # what the client sees
    entry: Mapping[str, Any]  # the backend's entry, with the advertised name in place of its own
    template: bool = False  # a URI template: URIs it expands to are read through it

    def fits(self, form: str, asked: str, literal: bool) -> bool:
        """Whether `asked` is `form` (this offering's advertised or own name), or a URI it expands to."""
        if not self.template or literal:
            return form == asked
        return template_pattern(form).fullmatch(asked) is not None


class Target(NamedTuple):
    """Where a client's URI or name goes: which backend, and under its own name there."""

    backend_id: str
    original: str


class Ambiguous(NamedTuple):
    """A URI or name several backends could mean, and the prefixed forms that tell them apart."""

    choices: tuple[str, ...]


def namespaced(
    entries: Mapping[str, Sequence[Mapping[str, Any]]],
    key: str,
    prefix: Prefix,
    separator: str,
    template: bool = False,
) -> list[Offering]:
    """Every backend's entries named uniquely by their `key` field (uri, uriTemplate or name)."""
    usable = {
        b: [e for e in listed if isinstance(e.get(key), str) and e[key]] for b, listed in entries.items()
    }
    names = {b: [str(e[key]) for e in listed] for b, listed in usable.items()}
    offerings = []
    for named in advertised_names(names, prefix, separator):
        entry = {**usable[named.backend_id][named.position], key: named.name}
        offerings.append(Offering(named.backend_id, named.original, named.name, entry, template))
    return offerings


def _decided(hits: Sequence[tuple[Offering, str]], separator: str) -> Target | Ambiguous | None:
    """One backend's hit, concrete entries before templates; several backends' are ambiguous."""
    concrete = [(o, own) for o, own in hits if not o.template]
    chosen = concrete or list(hits)
    backends = sorted({o.backend_id for o, _ in chosen})
    if not backends:
        return None
    if len(backends) > 1:
        return Ambiguous(tuple(prefixed(o.backend_id, own, separator) for o, own in chosen))
    offering, own = chosen[0]
    return Target(offering.backend_id, own)


def resolve(
    asked: str,
    offerings: Sequence[Offering],
    backends: Sequence[str],
    separator: str,
    literal: bool = False,
) -> Target | Ambiguous | None:
    """Where `asked` goes among `offerings` of the reachable `backends` (the order above); None: nowhere.

    `literal`: templates are matched as template strings, not by the URIs they expand to (a
    completion names the template itself).
    """
    advertised: list[tuple[Offering, str]] = []
    for o in offerings:
        if o.fits(o.name, asked, literal):
            cut = len(o.name) - len(o.original)  # the prefix a collision added, if any
            advertised.append((o, asked[cut:] if cut and asked.startswith(o.name[:cut]) else asked))
    if (found := _decided(advertised, separator)) is not None:
        return found
    marked: list[tuple[Offering, str]] = []
    for backend_id in backends:
        head = prefixed(backend_id, "", separator)
        if asked.startswith(head):
            own = asked[len(head) :]
            marked.extend(
                (o, own) for o in offerings if o.backend_id == backend_id and o.fits(o.original, own, literal)
            )
    if (found := _decided(marked, separator)) is not None:
        return found
    return _decided([(o, asked) for o in offerings if o.fits(o.original, asked, literal)], separator)


def ambiguity(what: str, asked: str, choices: Sequence[str]) -> str:
    """The message for an ambiguous URI or name: which forms name one backend's."""
    named = ", ".join(dict.fromkeys(choices))
    return f"{what} {asked} is offered by more than one backend: use one of {named}"
