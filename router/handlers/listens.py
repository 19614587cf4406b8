"""A 2026-07-28 client's `subscriptions/listen`: its backends' list changes and the updates of the
resources it names, on the request's own stream, through whichever replica it reached.

2026-07-28 has no standalone stream: a client opts in to what a server sends outside calls with a
`subscriptions/listen` request whose answer is the stream (SEP-2575). The request itself says all
the router needs, so the replica serving it holds nothing anyone else must know:

1. The filter is planned over the session's reachable backends (`ReachableBackends`): each named
   URI goes to the backend it belongs to, under the backend's own URI (found as a read finds it);
   `resourcesListChanged` and `promptsListChanged` to every backend offering resources or prompts;
   `toolsListChanged` to the backends of the router's pinned tools, the only tools of the client's
   that can change (find_tool searches the rest).
2. The acknowledgment comes first, as the spec has it, honoring what the plan can deliver: a URI no
   backend serves is left out of it, and so is `toolsListChanged` when nothing is pinned.
3. Each backend is listened to for the listen's life
   (router/upstream/session_wide/backend_listens.py), and what it sends is passed on under the
   subscription id, a resource's update under the URI the client named. A backend's
   `tools/list_changed` also has the indexer list it again (as on a handshake client's stream,
   router/handlers/notifications.py).

The stream ends gracefully (its `SubscriptionsListenResult`) when a backend's stream that was open
ends (the backend restarted or went away: the client listens again, and the new listen is planned
over the backends healthy then) and when the router begins to stop; at once when the client goes.

Bounds: at most `MAX_LISTENS` listens on one replica and `MAX_PER_SESSION` of one session there (a
session that callers share, an unverified principal's, has only the replica's bound),
`MAX_RESOURCES` URIs and `MAX_BACKENDS` backends in one listen. Events are level triggers, so one
waiting to be written is not queued twice: what waits is at most one of each kind and URI.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ResourceUpdated,
    ServerEvent,
    event_from_wire,
    event_matches,
    event_to_notification,
)
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)

from router.caller import Caller
from router.exchange import exchange_of
from router.handlers.notifications import TOOLS_CHANGED, Notifications
from router.handlers.resources import target_of
from router.upstream.session_wide.backend_listens import BackendListens, Interest
from router.upstream.session_wide.backend_requests import BackendRequests, Reach
from toolsearch.targets import BackendTarget

logger = logging.getLogger(__name__)

MAX_LISTENS = 1000  # listens one replica holds at once
MAX_PER_SESSION = 8  # and of those, one session's
MAX_RESOURCES = 256  # URIs one listen may name
MAX_BACKENDS = 32  # backends one listen reads


@dataclass
class ListenPlan:
    """What one listen asks of which backend, what it honors, and the client's name of each URI."""

    honored: SubscriptionFilter = field(default_factory=SubscriptionFilter)
    interests: dict[str, tuple[BackendTarget, Interest]] = field(default_factory=dict)
    names: dict[tuple[str, str], str] = field(default_factory=dict)  # (backend, its URI): the client's

    def add(
        self,
        target: BackendTarget,
        *,
        tools: bool = False,
        prompts: bool = False,
        resources: bool = False,
        uri: str = "",
    ) -> None:
        """Ask `target` for more: its lists' changes, or the updates of its resource `uri`."""
        _, had = self.interests.get(target.backend_id, (target, Interest()))
        self.interests[target.backend_id] = (
            target,
            Interest(
                tools_list_changed=had.tools_list_changed or tools,
                prompts_list_changed=had.prompts_list_changed or prompts,
                resources_list_changed=had.resources_list_changed or resources,
                uris=(had.uris | {uri}) if uri else had.uris,
            ),
        )


class Listens:
    """Serves `subscriptions/listen` over the caller's backends; `until_stopped` returns when the
    router begins to stop."""

    def __init__(
        self,
        requests: BackendRequests,
        listens: BackendListens,
        notifications: Notifications,
        pinned: Collection[str],
        until_stopped: Callable[[], Awaitable[None]],
    ) -> None:
        self.requests = requests
        self.listens = listens
        self.notifications = notifications
        self.pinned_backends = frozenset(pattern.partition("/")[0] for pattern in pinned)
        self.until_stopped = until_stopped
        self.open = 0
        self._by_session: dict[str, int] = {}

    async def listen(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        """Acknowledge, then pass the backends' notifications on until the listen ends."""
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen needs a request id: send it as a request")
        asked = params.notifications.resource_subscriptions or []
        if len(asked) > MAX_RESOURCES:
            raise MCPError(
                INVALID_PARAMS,
                f"one listen names at most {MAX_RESOURCES} resources, this one {len(asked)}: "
                "split them over several listens",
            )
        caller = exchange_of(ctx).caller
        counted = "" if caller.shared else caller.session_id
        self._admit(counted)
        try:
            plan = await self.plan(await self.requests.reach_from(ctx), params.notifications)
            meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
            await self._run(ctx, caller, plan, meta)
            return SubscriptionsListenResult(_meta=meta)
        finally:
            self._release(counted)

    def _admit(self, session_id: str) -> None:
        if self.open >= MAX_LISTENS:
            raise MCPError(
                INTERNAL_ERROR, f"this router holds {MAX_LISTENS} listens already: listen again shortly"
            )
        if session_id and self._by_session.get(session_id, 0) >= MAX_PER_SESSION:
            raise MCPError(
                INVALID_REQUEST,
                f"this session holds {MAX_PER_SESSION} listens on this router already: "
                "end one before opening another",
            )
        self.open += 1
        if session_id:
            self._by_session[session_id] = self._by_session.get(session_id, 0) + 1

    def _release(self, session_id: str) -> None:
        self.open -= 1
        if session_id:
            left = self._by_session.pop(session_id) - 1
            if left:
                self._by_session[session_id] = left

    async def plan(self, reach: Reach, wanted: SubscriptionFilter) -> ListenPlan:
        """What a listen asks of which of the session's backends, and what it can honour."""
        plan = ListenPlan()
        honored_uris: list[str] = []
        for uri in wanted.resource_subscriptions or []:
            try:
                where = await target_of(reach, uri)
            except MCPError as exc:  # no backend serves it now: not honored, which the ack says
                logger.debug("a listen's resource %s is not honored: %s", uri, exc.error.message)
                continue
            backend = next(b for b in reach.backends if b.backend_id == where.backend_id)
            plan.add(backend.target, uri=where.original)
            plan.names[(where.backend_id, where.original)] = uri
            honored_uris.append(uri)
        if wanted.resources_list_changed:
            for backend in reach.offering("resources"):
                plan.add(backend.target, resources=True)
        if wanted.prompts_list_changed:
            for backend in reach.offering("prompts"):
                plan.add(backend.target, prompts=True)
        tools = bool(wanted.tools_list_changed and self.pinned_backends)
        if tools:
            for backend in reach.backends:
                if backend.backend_id in self.pinned_backends:
                    plan.add(backend.target, tools=True)
        if len(plan.interests) > MAX_BACKENDS:
            left_out = sorted(plan.interests)[MAX_BACKENDS:]
            logger.warning(
                "a listen reaches %d backends: only %d are listened to (%s left out)",
                len(plan.interests),
                MAX_BACKENDS,
                ", ".join(left_out),
            )
            for backend_id in left_out:
                del plan.interests[backend_id]
            kept = {name for (backend_id, _), name in plan.names.items() if backend_id in plan.interests}
            honored_uris = [uri for uri in honored_uris if uri in kept]  # the ack says what is heard
        plan.honored = SubscriptionFilter(
            tools_list_changed=True if tools else None,
            prompts_list_changed=True if wanted.prompts_list_changed else None,
            resources_list_changed=True if wanted.resources_list_changed else None,
            resource_subscriptions=honored_uris or None,
        )
        return plan

    async def _run(
        self, ctx: ServerRequestContext[Any, Any], caller: Caller, plan: ListenPlan, meta: Mapping[str, Any]
    ) -> None:
        """Listen to the plan's backends and write what they send until one's stream ends, the
        router stops, or the client goes (cancelled)."""
        honored_uris = frozenset(plan.honored.resource_subscriptions or ())
        waiting: set[ServerEvent] = set()  # written yet: each kind and URI at most once
        send, receive = anyio.create_memory_object_stream[ServerEvent](4 + len(honored_uris))

        async def deliver(backend_id: str, message: Mapping[str, Any]) -> None:
            method = message.get("method")
            if method == TOOLS_CHANGED:
                await self.notifications.tools_changed(caller, backend_id)
                if backend_id not in self.pinned_backends:
                    return
            params = message.get("params")
            event = event_from_wire(str(method), params if isinstance(params, dict) else None)
            if isinstance(event, ResourceUpdated):
                name = plan.names.get((backend_id, event.uri))
                event = ResourceUpdated(uri=name) if name is not None else None
            if event is None or event in waiting or not event_matches(plan.honored, honored_uris, event):
                return
            waiting.add(event)
            send.send_nowait(event)  # never full: each kind and URI waits at most once

        # the acknowledgment waits until every backend listens (or failed to, or took its timeout),
        # so that what changes after the client was acknowledged is heard
        unsettled = set(plan.interests)
        settled = anyio.Event()

        def settle(backend_id: str) -> None:
            unsettled.discard(backend_id)
            if not unsettled:
                settled.set()

        async def upstream() -> None:
            async with send, anyio.create_task_group() as group:
                for target, interest in plan.interests.values():
                    group.start_soon(self._one, group.cancel_scope, caller, target, interest, deliver, settle)
                group.start_soon(self._stop_at_end, group.cancel_scope)

        async with anyio.create_task_group() as group:
            group.start_soon(upstream)
            if unsettled:
                slowest = max(target.timeout_seconds for target, _ in plan.interests.values())
                with anyio.move_on_after(slowest):
                    await settled.wait()
            ack = SubscriptionsAcknowledgedNotificationParams(notifications=plan.honored, _meta=dict(meta))
            await ctx.session.send_notification(
                SubscriptionsAcknowledgedNotification(params=ack), related_request_id=ctx.request_id
            )
            await self._write(ctx, receive, waiting, meta)

    async def _one(
        self,
        ended: anyio.CancelScope,
        caller: Caller,
        target: BackendTarget,
        interest: Interest,
        deliver: Callable[[str, Mapping[str, Any]], Awaitable[None]],
        settle: Callable[[str], None],
    ) -> None:
        backend_id = target.backend_id
        try:
            opened = await self.listens.listen(caller, target, interest, deliver, lambda: settle(backend_id))
        finally:
            settle(backend_id)
        if opened:
            logger.info("backend %s ended its stream: a listen through it ends", backend_id)
            ended.cancel()

    async def _stop_at_end(self, ended: anyio.CancelScope) -> None:
        await self.until_stopped()
        ended.cancel()

    @staticmethod
    async def _write(
        ctx: ServerRequestContext[Any, Any],
        receive: MemoryObjectReceiveStream[ServerEvent],
        waiting: set[ServerEvent],
        meta: Mapping[str, Any],
    ) -> None:
        async with receive:
            async for event in receive:
                waiting.discard(event)
                notification = event_to_notification(event, dict(meta))
                await ctx.session.send_notification(notification, related_request_id=ctx.request_id)
