"""Authorization denials as the router sees them, for its access line and its metric.

The indexer decides (docs/authorization.md); when it denies a call, a prompt's get or a resource's
read, its failed answer carries the labels of the policies that decided in the `toolsearch-denied-by`
trailer ("-" when no policy permits it). The router reads them here, off the failed indexer call,
with the action the request asked about: what the operator's records name. The client's answer never
does: it is an unknown tool's, prompt's or resource's (router/link/indexer_errors.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from toolsearch.trailers import DENIED_BY_KEY, NO_PERMIT

# the action a request about an item asks, by the item's kind; a resolution (no item) is a tool call's
ACTIONS = {"tool": "call_tool", "prompt": "get_prompt", "resource": "read_resource"}


@dataclass(frozen=True, slots=True)
class Denial:
    """One denial: the action asked, and the policies that decided (none: no policy permits it)."""

    action: str
    policies: tuple[str, ...]

    @property
    def label(self) -> str:
        """The policies as the access line names them: comma-separated, `-` when none permits it."""
        return ",".join(self.policies) or NO_PERMIT


def denial_of(exc: grpc.aio.AioRpcError, request: Any) -> Denial | None:
    """The denial an indexer call's failure reports, if it is one (else None: an unknown name, ...)."""
    for key, value in exc.trailing_metadata() or ():
        if key == DENIED_BY_KEY and isinstance(value, str):
            policies = () if value == NO_PERMIT else tuple(p for p in value.split(",") if p)
            item = getattr(request, "item", None)
            action = ACTIONS.get(item.kind, "call_tool") if item is not None else "call_tool"
            return Denial(action, policies)
    return None
