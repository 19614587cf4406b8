"""What an answer says of itself: that nothing in it fits, or which of a task's needs it serves and which not.

An agent acts on the words as much as on the tools: told "possible" for a tool that cannot do the
task, it calls it. So an answer whose every tool is weak says plainly that nothing here fits, and
an answer to a task of several needs whose tools fit some needs and none of the others names the
ones left without a tool, so the agent can do those without one, or ask for each alone. A need is
met when a tool of the answer that serves it best (`Hit.need`) is strong or possible. Both
`toolsearch eval` (abstention) and the indexer's answers read the same verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from indexer.retrieval.query import Query
from indexer.retrieval.second_stage import Judged

NEED_CHARS = 80  # of a need quoted in an answer's message
QUOTED_NEEDS = 6  # needs quoted at most, each way


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether anything in an answer fits, and for a task of several needs, which needs are met."""

    nothing_fits: bool
    met: tuple[int, ...] = ()  # positions in Query.needs; only for a query of several needs
    unmet: tuple[int, ...] = ()


def verdict(query: Query, judged: Sequence[Judged]) -> Verdict:
    """The verdict on an answer of `judged` tools to `query`; an empty answer is no verdict at all."""
    if not judged:
        return Verdict(nothing_fits=False)
    fitting = [j for j in judged if j.band != "weak"]
    if not fitting:
        return Verdict(nothing_fits=True)
    if len(query.needs) < 2:
        return Verdict(nothing_fits=False)
    if any(j.hit.exact for j in fitting):  # a tool named outright: the caller knows what it wants
        return Verdict(nothing_fits=False)
    met = sorted({j.hit.need for j in fitting if j.hit.need > 0})
    unmet = [need for need in range(1, len(query.needs)) if need not in met]
    return Verdict(nothing_fits=False, met=tuple(met), unmet=tuple(unmet) if met else ())


def quoted(text: str) -> str:
    """A need as an answer quotes it: on one line, cut at a word within NEED_CHARS."""
    text = " ".join(text.split())
    if len(text) > NEED_CHARS:
        text = text[:NEED_CHARS].rsplit(" ", 1)[0] + "…"
    return f'"{text}"'


def nothing_fits_note() -> str:
    """The message of an answer whose every tool is weak."""
    return (
        "Nothing here fits this task: no tool matches it strongly, or even possibly; the tools "
        "below are only the closest and probably cannot do it. Do without a tool, or describe the "
        "task differently."
    )


def partial_note(query: Query, found: Verdict) -> str:
    """The message of an answer that serves some needs of the task and not others; "" otherwise."""
    if not found.unmet:
        return ""
    unmet = [quoted(query.needs[n].text) for n in found.unmet[:QUOTED_NEEDS]]
    more = len(found.unmet) - len(unmet)
    note = (
        "Some parts of this task have a tool here and some do not. No tool below serves: "
        + "; ".join(unmet)
        + (f" (and {more} more)" if more > 0 else "")
        + ". Do those without a tool, or search for each on its own."
    )
    met = [quoted(query.needs[n].text) for n in found.met[:QUOTED_NEEDS]]
    return note + " The tools below serve: " + "; ".join(met) + "."
