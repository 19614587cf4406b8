"""call_tool's way to a backend: the name resolved, the arguments checked, the backend called inside
the client session's backend session, and a client's cancellation passed on.

The backend session a call opens is stored with the client session in the indexer
(`SetBackendSession`), so every router replica's next call reuses it; the tool's resolution hands it
back. That resolution mostly comes with the session check the request made already (the session
layer asks `GetSession` to resolve the `tool_name` it sees); `ResolveTool` is asked only when the
name did not resolve there, and says why. Errors are router errors (router/errors.py); the
meta-tools turn them into answers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from router.caller import Caller
from router.errors import BackendRejected, CallCancelled, InvalidRequest
from router.handlers.arguments import parse_call_tool
from router.handlers.schemas import SchemaValidators
from router.link.indexer_client import IndexerClient
from router.upstream.calls.backends import BackendCaller, CallOutcome
from router.upstream.calls.credentials import OutgoingCredentials
from router.upstream.calls.running_calls import RunningCalls
from router.upstream.calls.session_keeping import SessionKeeper
from router.upstream.calls.session_notes import noted_call
from router.upstream.session_wide.backend_notices import BackendNotices
from router.upstream.wire.backend_messages import backend_request_id
from router.upstream.wire.relays import ClientAsker, NotificationRelay
from toolsearch.targets import BackendTarget

logger = logging.getLogger(__name__)


class ToolCalls:
    """Runs call_tool for a caller; `max_arguments_bytes` 0 sets no size limit."""

    def __init__(
        self,
        indexer: IndexerClient,
        backends: BackendCaller,
        secrets: Mapping[str, str],
        max_arguments_bytes: int = 0,
    ) -> None:
        self.indexer = indexer
        self.backends = backends
        self.credentials = OutgoingCredentials(indexer, secrets)
        self.max_arguments_bytes = max_arguments_bytes
        self.validators = SchemaValidators()
        self.running = RunningCalls()
        self.notices = BackendNotices(indexer, backends, self.credentials)

    async def run(
        self,
        caller: Caller,
        arguments: Mapping[str, Any] | None,
        relay: NotificationRelay | None = None,
        call_id: str | None = None,
        retry: Mapping[str, Any] | None = None,
        asker: ClientAsker | None = None,
    ) -> dict[str, Any]:
        """call_tool: resolve the name in the caller's session, check the arguments, call the backend;
        the backend's result as it came (with a note when its backend session was replaced).
        `retry` is what a retried input-required call carries back to its backend; `asker` asks the
        client what a backend of the other era asks it (router/upstream/rounds/input_rounds.py)."""
        args = parse_call_tool(arguments, self.max_arguments_bytes)
        # resolved with the session check from the same `tool_name`, unless it did not resolve there
        tool = caller.resolved or await self.indexer.resolve_tool(
            caller.session_id, caller.identity.principal, args.name
        )
        problem = self.validators.problem(tool.input_schema_json, args.parameters)
        if problem is not None:
            raise InvalidRequest(
                f"invalid parameters for {args.name}: {problem}. Fix the parameters to match the tool's "
                "inputSchema (find_tool shows it) and call again."
            )
        # a shared implied session keeps no backend session: each call opens its own
        target = replace(tool.target, session=None) if caller.shared else tool.target
        name = tool.original_name or args.name
        headers = await self.credentials.headers(target, caller.identity)
        try:
            outcome, keeper = await self._call(
                caller, target, name, args.parameters, headers, relay, call_id, retry, asker
            )
        except BackendRejected as exc:
            if exc.status != 401 or target.auth.type != "token_exchange":
                raise
            # The token kept for this caller was refused (revoked, or signed with a retired key):
            # refused, the call did not run; one fresh exchange, and one more try.
            headers = await self.credentials.headers(target, caller.identity, renew=True)
            outcome, keeper = await self._call(
                caller, target, name, args.parameters, headers, relay, call_id, retry, asker
            )
        return noted_call(outcome.result, keeper.note(outcome.replaced))

    async def _call(
        self,
        caller: Caller,
        target: BackendTarget,
        name: str,
        parameters: Mapping[str, Any],
        headers: Mapping[str, str],
        relay: NotificationRelay | None,
        call_id: str | None,
        retry: Mapping[str, Any] | None,
        asker: ClientAsker | None,
    ) -> tuple[CallOutcome, SessionKeeper]:
        """One call in the backend session the keeper keeps; a client's cancellation ends it here."""
        keeper = SessionKeeper(self.indexer, self.backends, caller, target, headers)
        try:
            with self.running.running(caller.session_id, call_id) as running:
                outcome = await self.backends.call_tool(
                    target,
                    name,
                    parameters,
                    headers,
                    relay=relay,
                    call_id=call_id,
                    on_open=keeper,
                    declared=caller.declared,
                    retry=retry,
                    asker=asker,
                )
        finally:
            await keeper.close()
        if running.cancelled:
            raise CallCancelled(target.backend_id, running.reason)
        return outcome, keeper

    async def cancel(self, caller: Caller, params: Mapping[str, Any]) -> None:
        """Pass a client's `notifications/cancelled` on to every backend its session has a session at.

        The call it cancels may run on another replica, and only the backend knows it: the backend
        request's id comes from the client's own (`backend_request_id`), so each backend session is
        told, and the one running it stops (a backend ignores an id it does not know). The call runs
        here, it ends here at once.
        """
        request_id = params.get("requestId")
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            return
        reason = params.get("reason") if isinstance(params.get("reason"), str) else None
        call_id = backend_request_id(request_id)
        self.running.cancel(caller.session_id, call_id, reason)
        told = {"requestId": call_id, **({"reason": reason} if reason else {})}
        await self.notices.tell_all(caller, "notifications/cancelled", told)
