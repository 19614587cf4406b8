"""`prompts/list`, `prompts/get` and `completion/complete` over the session's reachable backends.

Prompts are listed, named and resolved as resources are (router/handlers/resources.py,
router/handlers/offerings.py):
a listing asks every reachable backend that offers prompts, a failing one left out; a `prompts/get`
finds the backend a name belongs to and forwards it under the backend's own name. A completion names
a prompt or a resource template: the router finds its backend the same way and forwards the
request with the backend's own name or template, to a backend that declared completions; one that
did not gets no request, and the client an empty completion, as from a server with nothing to offer.
Under an authorization policy, prompts and templates are those the caller may see
(router/handlers/resources.py), and a `prompts/get` is decided with its arguments; a denied one
answers exactly as a prompt no backend has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CompleteRequestParams, GetPromptRequestParams, PaginatedRequestParams

from router.error_answers import mcp_error
from router.errors import RouterError
from router.handlers.offerings import Ambiguous, Target, ambiguity, namespaced, resolve
from router.handlers.passthrough import PassedThrough
from router.handlers.resources import (
    RESOURCE_NOT_FOUND,
    Permitted,
    advertised,
    catalogue,
    permitted,
    record_hidden,
)
from router.upstream.session_wide.backend_requests import BackendRequests, Reach, complete
from router.upstream.session_wide.broadcast import ask_each
from toolsearch.sessions import Offered
from toolsearch.targets import ReachableTarget

NO_COMPLETION: dict[str, Any] = {"completion": {"values": [], "hasMore": False}}


async def prompt_catalogue(reach: Reach) -> Permitted:
    """The prompts of every reachable backend that offers them, under their advertised names: those
    the caller may see, and apart those it may not."""

    async def ask(backend: ReachableTarget) -> list[dict[str, Any]]:
        return await reach.list_all(backend, "prompts/list", "prompts")

    answers = await ask_each(reach.offering("prompts"), ask, "prompts/list")
    named = namespaced(
        {a.backend.backend_id: a.value for a in answers}, "name", reach.prefix, reach.separator
    )
    return await permitted(reach, "prompt", named)


def _prompt_not_found(name: str) -> MCPError:
    return MCPError(
        INVALID_PARAMS,
        f"prompt not found: {name}. Use a name that prompts/list gives (list prompts first: the "
        "prompts of backends that share a name carry the backend's prefix).",
    )


class Prompts:
    """The handlers of the prompt methods and of completions."""

    def __init__(self, requests: BackendRequests) -> None:
        self.requests = requests

    async def list_prompts(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams
    ) -> dict[str, Any]:
        return complete(
            {
                "prompts": [
                    dict(o.entry) for o in (await prompt_catalogue(await self.requests.reach_from(ctx))).kept
                ]
            }
        )

    async def _prompt(self, reach: Reach, name: str, arguments: Mapping[str, Any] | None = None) -> Target:
        """The backend and own name of a prompt the client named; raises the JSON-RPC error (a prompt
        the policy denies the caller, with these arguments, as an unknown one)."""
        backends = [b.backend_id for b in reach.offering("prompts")]
        listed = await prompt_catalogue(reach)
        prompts = listed.kept
        where = resolve(name, prompts, backends, reach.separator)
        if isinstance(where, Ambiguous):
            raise MCPError(INVALID_PARAMS, ambiguity("the prompt", name, where.choices))
        if where is None:
            if arguments is not None:  # a get (not a completion): a denial is recorded as such
                await record_hidden(reach, "prompt", name, listed.hidden)
            raise _prompt_not_found(name)
        asked = Offered("prompt", advertised(where, prompts, name), where.backend_id)
        if arguments is not None and not await reach.permits(asked, arguments):  # a get: with its arguments
            raise _prompt_not_found(name)
        return where

    async def _template(self, reach: Reach, uri: str) -> Target:
        """The backend and own template of a resource template the client named."""
        backends = [b.backend_id for b in reach.offering("resources")]
        found = await catalogue(reach, resources=False)
        where = resolve(uri, found.templates, backends, reach.separator, literal=True)
        if isinstance(where, Ambiguous):
            raise MCPError(RESOURCE_NOT_FOUND, ambiguity("the resource template", uri, where.choices))
        if where is None:
            raise MCPError(
                RESOURCE_NOT_FOUND,
                f"resource template not found: {uri}. Complete an argument of a template that "
                "resources/templates/list gives (list them first).",
            )
        return where

    async def _forward(
        self, reach: Reach, target: Target, method: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        backend = next(b for b in reach.backends if b.backend_id == target.backend_id)
        try:
            # a backend may ask the client before it gives a prompt (router/upstream/rounds/input_rounds.py)
            if method == "prompts/get":
                return complete(await reach.asking(backend, method, params))
            return complete(await reach.send(backend, method, params))
        except RouterError as exc:
            raise mcp_error(exc) from None

    async def get_prompt(
        self, ctx: ServerRequestContext[Any, Any], params: GetPromptRequestParams
    ) -> dict[str, Any]:
        reach = await self.requests.reach_from(ctx)
        wire = params.model_dump(mode="json", by_alias=True, exclude_none=True)
        if (resumed := await reach.resumed(wire)) is not None:  # the retry of a round the router made
            return PassedThrough(complete(resumed))
        target = await self._prompt(reach, params.name, params.arguments or {})
        return PassedThrough(
            await self._forward(reach, target, "prompts/get", {**wire, "name": target.original})
        )

    async def complete(
        self, ctx: ServerRequestContext[Any, Any], params: CompleteRequestParams
    ) -> dict[str, Any]:
        reach = await self.requests.reach_from(ctx)
        wire = params.model_dump(mode="json", by_alias=True, exclude_none=True)
        ref = dict(wire.get("ref") or {})
        if ref.get("type") == "ref/prompt":
            target = await self._prompt(reach, str(ref.get("name", "")))
            ref["name"] = target.original
        else:
            target = await self._template(reach, str(ref.get("uri", "")))
            ref["uri"] = target.original
        if not any(b.backend_id == target.backend_id for b in reach.offering("completions")):
            return complete(NO_COMPLETION)  # the backend declared no completions: it has none to give
        return await self._forward(reach, target, "completion/complete", {**wire, "ref": ref})
