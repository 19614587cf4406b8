"""`resources/list`, `resources/templates/list` and `resources/read` over the session's reachable backends.

Each request asks the indexer which backends the session reaches now
(router/upstream/session_wide/backend_requests.py), lists what those that offer resources have
(router/upstream/session_wide/broadcast.py: at once, bounded, a failing backend left out), names
it on collision (router/handlers/offerings.py) and answers with one page: the router keeps no
cursor between requests, so a listing is whole, up to `MAX_ENTRIES` per backend. A read finds the
backend a URI belongs to the same way, and forwards it under the backend's own URI; when only one
reachable backend offers resources and nothing is prefixed, the read goes to it without a listing.
`resources/subscribe` and `resources/unsubscribe` go to the URI's backend the same way.

Under an authorization policy (the indexer says so with the reachable backends) a listing keeps what
the caller may see (`VisibleItems`, one question for the whole listing), a read or a subscription
resolves among those alone, never by the shortcut, and the URI it reads is asked of the policy
(`AuthorizeCall`: a URI a visible template expands to may still be denied). What the caller may not
use answers exactly as a URI no backend has, its read asked of the policy all the same so that the
denial is recorded. Without a policy none of this asks the indexer anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    METHOD_NOT_FOUND,
    PaginatedRequestParams,
    ReadResourceRequestParams,
    SubscribeRequestParams,
    UnsubscribeRequestParams,
)

from router.error_answers import mcp_error
from router.errors import BackendAnswered, RouterError
from router.handlers.offerings import Ambiguous, Offering, Target, ambiguity, namespaced, resolve
from router.handlers.passthrough import PassedThrough
from router.upstream.session_wide.backend_requests import BackendRequests, Reach, complete
from router.upstream.session_wide.broadcast import ask_each
from toolsearch.naming import prefixed
from toolsearch.sessions import Offered, OfferedKind, Subscription
from toolsearch.targets import ReachableTarget

RESOURCE_NOT_FOUND = -32002  # MCP's code for a resource that does not exist


class Listed(NamedTuple):
    """One backend's resources and templates, as it listed them."""

    resources: list[dict[str, Any]]
    templates: list[dict[str, Any]]


class Catalogue(NamedTuple):
    """The reachable backends' resources and templates under their advertised URIs; under a policy,
    those the caller may see, and apart those it may not (`hidden`)."""

    resources: list[Offering]
    templates: list[Offering]
    hidden: list[Offering]


class Permitted(NamedTuple):
    """Offerings split by what the caller may see: all of them `kept` without a policy."""

    kept: list[Offering]
    hidden: list[Offering]


async def catalogue(reach: Reach, resources: bool = True, templates: bool = True) -> Catalogue:
    """List the resources and/or templates of every reachable backend that offers resources."""

    async def ask(backend: ReachableTarget) -> Listed:
        # one after the other: the first may open the backend session the second then uses
        found = await _listing(reach, backend, "resources/list", "resources") if resources else []
        shapes = (
            await _listing(reach, backend, "resources/templates/list", "resourceTemplates")
            if templates
            else []
        )
        return Listed(found, shapes)

    what = "resources/list" if resources else "resources/templates/list"
    answers = await ask_each(reach.offering("resources"), ask, what, requests=2)
    found = namespaced(
        {a.backend.backend_id: a.value.resources for a in answers}, "uri", reach.prefix, reach.separator
    )
    shapes = namespaced(
        {a.backend.backend_id: a.value.templates for a in answers},
        "uriTemplate",
        reach.prefix,
        reach.separator,
        template=True,
    )
    both = await permitted(reach, "resource", [*found, *shapes])
    kept = both.kept
    return Catalogue([o for o in kept if not o.template], [o for o in kept if o.template], both.hidden)


async def permitted(reach: Reach, kind: OfferedKind, offerings: list[Offering]) -> Permitted:
    """The offerings the caller may see, under the names the session lists them (a template by its
    URI template): with a policy, what it may not use is kept apart, so that no listing, read,
    completion or subscription reaches it, by any of its names."""
    if not reach.authorized or not offerings:
        return Permitted(offerings, [])
    seen = await reach.visible([Offered(kind, o.name, o.backend_id) for o in offerings])
    kept = [offering for offering, visible in zip(offerings, seen, strict=True) if visible]
    return Permitted(
        kept, [offering for offering, visible in zip(offerings, seen, strict=True) if not visible]
    )


async def record_hidden(reach: Reach, kind: OfferedKind, asked: str, hidden: Sequence[Offering]) -> None:
    """Ask the policy about a name that means only what the caller may not see, so that the denial is
    recorded with the policies that decided (the indexer's line, both counters, the access line);
    the caller's answer is an unknown name's either way."""
    backends = sorted({offering.backend_id for offering in hidden})
    where = resolve(asked, hidden, backends, reach.separator)
    if isinstance(where, Target):
        await reach.permits(Offered(kind, advertised(where, hidden, asked), where.backend_id))


def advertised(target: Target, offerings: Sequence[Offering], asked: str) -> str:
    """The name the session lists a target under, which the policy reads; a URI a template expands
    to, as the client asked for it."""
    for offering in offerings:
        if (offering.backend_id, offering.original) == target and not offering.template:
            return offering.name
    return asked


async def _listing(reach: Reach, backend: ReachableTarget, method: str, field: str) -> list[dict[str, Any]]:
    """A backend's whole listing; none from a backend that does not know the method (a server with
    resources and no templates, the common case, answers `resources/templates/list` so)."""
    try:
        return await reach.list_all(backend, method, field)
    except BackendAnswered as exc:
        if exc.code != METHOD_NOT_FOUND:
            raise
        return []


def _not_found(uri: str) -> MCPError:
    return MCPError(
        RESOURCE_NOT_FOUND,
        f"resource not found: {uri}. Read a URI that resources/list gives, or one that a template of "
        "resources/templates/list expands to (list them first: the URIs of backends that share one "
        "carry the backend's prefix).",
    )


def _shortcut(reach: Reach, uri: str) -> Target | None:
    """The backend a URI goes to without a listing: the one reachable backend offering resources,
    when nothing can collide and no policy decides what the caller may read. A URI that starts with
    the backend's prefix is left to `resolve`: it may be the prefixed form (`always` naming, or a
    collision that went away) or the backend's own."""
    offering = reach.offering("resources")
    if len(offering) != 1 or reach.authorized:  # with a policy, what the caller may read is listed
        return None
    backend_id = offering[0].backend_id
    head = prefixed(backend_id, "", reach.separator)
    if reach.prefix == "on_collision" and not uri.startswith(head):
        return Target(backend_id, uri)
    return None


def _renamed(result: dict[str, Any], original: str, asked: str) -> dict[str, Any]:
    """A read's result with the backend's own URI given back as the client asked for it."""
    contents = result.get("contents")
    if original == asked or not isinstance(contents, list):
        return result
    renamed = [
        {**c, "uri": asked} if isinstance(c, dict) and c.get("uri") == original else c for c in contents
    ]
    return {**result, "contents": renamed}


class Resources:
    """The handlers of the resource methods."""

    def __init__(self, requests: BackendRequests) -> None:
        self.requests = requests

    async def list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams
    ) -> dict[str, Any]:
        found = await catalogue(await self.requests.reach_from(ctx), templates=False)
        return complete({"resources": [dict(o.entry) for o in found.resources]})

    async def list_templates(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams
    ) -> dict[str, Any]:
        found = await catalogue(await self.requests.reach_from(ctx), resources=False)
        return complete({"resourceTemplates": [dict(o.entry) for o in found.templates]})

    async def read(
        self, ctx: ServerRequestContext[Any, Any], params: ReadResourceRequestParams
    ) -> dict[str, Any]:
        reach = await self.requests.reach_from(ctx)
        wire = params.model_dump(mode="json", by_alias=True, exclude_none=True)
        if (resumed := await reach.resumed(wire)) is not None:  # the retry of a round the router made
            return PassedThrough(complete(resumed))
        return PassedThrough(complete(await _forwarded(reach, "resources/read", params)))

    async def subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams
    ) -> dict[str, Any]:
        """`resources/subscribe`, passed on to the URI's backend inside the client session's backend
        session, where the backend keeps it; its updates reach the client on the session's
        standalone stream, whichever replica holds it (router/handlers/notifications.py). A backend
        of the 2026-07-28 era alone (it refuses the handshake) keeps none: the session keeps it
        instead, and the stream's replica asks the backend with a listen
        (router/handlers/modern_listens.py)."""
        return await _subscription(await self.requests.reach_from(ctx), "resources/subscribe", params)

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> dict[str, Any]:
        """`resources/unsubscribe`, passed on (or kept) as `subscribe` is."""
        return await _subscription(await self.requests.reach_from(ctx), "resources/unsubscribe", params)


async def target_of(reach: Reach, uri: str) -> Target:
    """The backend a client's URI belongs to and the backend's own URI; raises the MCP errors (a
    resource the policy denies the caller as an unknown one)."""
    target = _shortcut(reach, uri)
    if target is not None:
        return target
    found = await catalogue(reach)
    backends = [b.backend_id for b in reach.offering("resources")]
    where = resolve(uri, [*found.resources, *found.templates], backends, reach.separator)
    if isinstance(where, Ambiguous):
        raise MCPError(RESOURCE_NOT_FOUND, ambiguity("the resource", uri, where.choices))
    if where is None:
        await record_hidden(reach, "resource", uri, found.hidden)
        raise _not_found(uri)
    # a URI a visible template expands to is read only when the policy permits that URI
    if not await reach.permits(
        Offered("resource", advertised(where, found.resources, uri), where.backend_id)
    ):
        raise _not_found(uri)
    return where


async def _subscription(
    reach: Reach, method: str, params: SubscribeRequestParams | UnsubscribeRequestParams
) -> dict[str, Any]:
    """A subscription's change: passed on to the URI's backend, in a handshake session (opened for
    it at a backend the router speaks 2026-07-28 to); kept with the client session instead when the
    backend refuses the handshake, and so keeps no subscriptions (router/handlers/modern_listens.py)."""
    target = await target_of(reach, params.uri)
    backend = next(b for b in reach.backends if b.backend_id == target.backend_id)
    if not reach.refuses_sessions(backend):
        try:
            return PassedThrough(complete(await _forwarded(reach, method, params, target)))
        except MCPError:
            if not reach.refuses_sessions(backend):  # it refused the handshake just now
                raise
    subscription = Subscription(target.backend_id, target.original)
    try:
        await reach.keep_subscription(subscription, method == "resources/subscribe")
    except RouterError as exc:
        raise mcp_error(exc) from None
    return complete({})


async def _forwarded(
    reach: Reach,
    method: str,
    params: ReadResourceRequestParams | SubscribeRequestParams | UnsubscribeRequestParams,
    target: Target | None = None,
) -> dict[str, Any]:
    """A request naming a URI, sent to the URI's backend (`target`, when found already) under the
    backend's own URI: its result (a read's under the client's URI again, its backend's requests
    of the client asked as a call's)."""
    target = target or await target_of(reach, params.uri)
    backend = next(b for b in reach.backends if b.backend_id == target.backend_id)
    wire = {**params.model_dump(mode="json", by_alias=True, exclude_none=True), "uri": target.original}
    try:
        if method != "resources/read":
            return await reach.send(backend, method, wire)
        return await reach.asking(
            backend, method, wire, lambda found: _renamed(found, target.original, params.uri)
        )
    except RouterError as exc:
        raise mcp_error(exc) from None
