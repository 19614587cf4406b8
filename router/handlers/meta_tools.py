"""`find_tool` and `call_tool`: the handlers of the only two tools a client sees (their schemas are
router/handlers/meta_tool_schemas.py).

Router errors become MCP answers here and only here: a mistake the model can correct (a wrong
argument, an unknown tool, a failing backend) is a tool result with `isError` and a message saying
how to correct it; a fault of the router's own (the indexer down) is a JSON-RPC error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import mcp_types as types
from mcp.server.context import HandlerResult, ServerRequestContext

from router.caller import Caller
from router.error_answers import mcp_error, text_result, tool_result_for
from router.errors import BackendAnswered, InvalidRequest, RouterError
from router.handlers.arguments import parse_find_tool
from router.handlers.meta_tool_schemas import (
    CALL_TOOL,
    CALL_TOOL_DESCRIPTION,
    CALL_TOOL_INPUT_SCHEMA,
    FIND_TOOL,
    FIND_TOOL_OUTPUT_SCHEMA,
    META_TOOLS,
    find_tool_input_schema,
)
from router.handlers.passthrough import PassedThrough, answer
from router.handlers.tool_calls import ToolCalls
from router.link.indexer_client import IndexerClient
from router.upstream.calls.backends import BackendCaller
from router.upstream.rounds.input_rounds import InputRounds
from router.upstream.session_wide.backend_requests import caller_of
from router.upstream.wire.backend_messages import backend_request_id
from router.upstream.wire.relays import NotificationRelay
from toolsearch.answers import render_answer
from toolsearch.sections.indexer_settings import Search

logger = logging.getLogger(__name__)

INDEX_META_KEY = "toolsearch/index"


def _listed(definition_json: str) -> types.Tool:
    """A pinned tool as tools/list advertises it: its definition as the backend gave it."""
    return types.Tool.model_validate(json.loads(definition_json))


def _retry(params: types.CallToolRequestParams) -> dict[str, Any]:
    """What a client's retry of an input-required call carries back to the backend, as it came."""
    return params.model_dump(
        mode="json", by_alias=True, exclude_none=True, include={"input_responses", "request_state"}
    )


def _progress_token(params: types.CallToolRequestParams) -> str | int | None:
    meta = params.meta  # a TypedDict of its snake_case keys
    return meta.get("progress_token") if meta is not None else None


class MetaTools:
    """The handlers behind `tools/list` and `tools/call`; `max_arguments_bytes` 0 sets no size limit."""

    def __init__(
        self,
        indexer: IndexerClient,
        backends: BackendCaller,
        search: Search,
        secrets: Mapping[str, str],
        max_arguments_bytes: int = 0,
        pinned: Sequence[str] = (),
    ) -> None:
        self.indexer = indexer
        self.pinned = list(pinned)  # "backend/tool" or "backend/*": advertised beside the meta-tools
        self.max_limit = search.max_limit
        self.compact = search.compact
        self.calls = ToolCalls(indexer, backends, secrets, max_arguments_bytes)
        # a 2026-07-28 client's calls that a handshake-era backend may ask something (the app's
        # lifespan sets it, with the task group the calls run in); None: such requests are refused
        self.rounds: InputRounds | None = None
        self.schemas = {FIND_TOOL: find_tool_input_schema(search), CALL_TOOL: CALL_TOOL_INPUT_SCHEMA}
        self.tools = [
            types.Tool(
                name=FIND_TOOL,
                description=search.find_tool_description,
                input_schema=self.schemas[FIND_TOOL],
                output_schema=FIND_TOOL_OUTPUT_SCHEMA,
                annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
            ),
            types.Tool(
                name=CALL_TOOL, description=CALL_TOOL_DESCRIPTION, input_schema=CALL_TOOL_INPUT_SCHEMA
            ),
        ]

    async def noticed(self, caller: Caller, method: str, params: Mapping[str, Any]) -> None:
        """A client's notification its backends are told of (the session layer's hook): a
        cancellation ends its call here and goes to every backend session; anything else (its roots
        changed) just goes to every backend session."""
        if method == "notifications/cancelled":
            await self.calls.cancel(caller, params)
        else:
            await self.calls.notices.tell_all(caller, method, params)

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        """A meta-tool's input schema by name (the SDK checks `Mcp-Param-*` headers against it)."""
        return self.schemas.get(name)

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if not self.pinned:
            return types.ListToolsResult(tools=self.tools)
        caller = caller_of(ctx)
        if not caller.session_id:
            # a sessionless (2026-07-28) listing: pinned tools belong to a session's backends
            return types.ListToolsResult(tools=self.tools)
        try:
            pinned = await self.indexer.pinned_tools(
                caller.session_id, caller.identity.principal, self.pinned
            )
        except RouterError as exc:
            tool_result_for(exc)  # raises the JSON-RPC error for the router's own faults
            return types.ListToolsResult(tools=self.tools)
        extra = [_listed(definition) for definition in pinned]
        return types.ListToolsResult(tools=[*self.tools, *(t for t in extra if t.name not in META_TOOLS)])

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> HandlerResult:
        """`tools/call`: run find_tool or call_tool for the caller the session layer identified."""
        caller = caller_of(ctx)
        # only a streamed answer (the session layer's choice) can carry notifications before the result
        relay = None
        if caller.streamed:
            relay = NotificationRelay(ctx, _progress_token(params), caller.declared.log_floor, caller.stream)
        try:
            if params.name == FIND_TOOL:
                return await self.find_tool(caller, params.arguments)
            # the backend's result is answered as it came (router/handlers/passthrough.py)
            if params.name == CALL_TOOL:
                return PassedThrough(await self._run(caller, params, params.arguments, relay, ctx.request_id))
            if self.pinned:
                # a pinned tool called by its own name: the same path as call_tool, health included
                arguments = {"tool_name": params.name, "parameters": params.arguments or {}}
                try:
                    return PassedThrough(await self._run(caller, params, arguments, relay, ctx.request_id))
                except BackendAnswered as exc:
                    # called as the client would call its backend, it gets the backend's JSON-RPC
                    # error as one too (a refused request state, say), not a tool result
                    raise mcp_error(exc) from None
        except RouterError as exc:
            return tool_result_for(exc)
        return text_result(
            f"unknown tool {params.name}: this server has two tools, find_tool and call_tool. To run "
            f"{params.name}, call call_tool with tool_name {json.dumps(params.name)}.",
            is_error=True,
        )

    async def _run(
        self,
        caller: Caller,
        params: types.CallToolRequestParams,
        arguments: Mapping[str, Any] | None,
        relay: NotificationRelay | None,
        request_id: types.RequestId | None,
    ) -> dict[str, Any]:
        """One call of `params` with call_tool's `arguments`, as an input round where its backend may
        ask a 2026-07-28 client something, and a client's retry of a round the router made answered
        from that round; `request_id` is the client's, which the backend request's id is made of."""
        call_id = backend_request_id(request_id) if request_id is not None else None
        retry = _retry(params)
        rounds = self.rounds
        if rounds is not None:
            resumed = await rounds.resume(caller, retry)  # never sent to the backend: its state is ours
            if resumed is not None:
                return resumed
            if rounds.applies(caller):
                return await rounds.run(
                    caller, lambda asker: self.calls.run(caller, arguments, relay, call_id, retry, asker)
                )
            asker = rounds.on_stream(caller, relay)
            return await self.calls.run(caller, arguments, relay, call_id, retry, asker)
        return await self.calls.run(caller, arguments, relay, call_id, retry)

    async def answer_directly(
        self, caller: Caller, params: types.CallToolRequestParams, request_id: types.RequestId
    ) -> dict[str, Any]:
        """find_tool or call_tool answered in front of the SDK's server, as JSON to a handshake-era
        client (router/frontdoor/direct_calls.py): the tool result the SDK's path gives, a backend's
        passed through as it came. A find's session-check errors and the router's own faults
        propagate, for the session layer to answer as it answers a failed check; a call's go
        where `call_tool` sends them (a tool result, or `MCPError` for a JSON-RPC error)."""
        if params.name == FIND_TOOL:
            try:
                return await self.find_tool(caller, params.arguments)
            except InvalidRequest as exc:  # arguments the model got wrong: it reads why
                # found before the search could check the session: checked here, so that a request
                # in a session that does not exist is answered 404 whatever its arguments
                await self.indexer.get_session(caller.session_id, caller.identity.principal)
                return tool_result_for(exc)
        try:
            result = await self._run(caller, params, params.arguments, None, request_id)
        except RouterError as exc:
            return tool_result_for(exc)
        return answer(PassedThrough(result), {}, None)  # the handshake era's envelope: none

    async def find_tool(self, caller: Caller, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
        """Search the caller's session; the answer is the same JSON as structured content and as text."""
        args = parse_find_tool(arguments, self.max_limit)
        compact = self.compact if args.compact is None else args.compact
        found = await self.indexer.find_tools(
            caller.session_id,
            caller.identity.principal,
            args.description,
            args.keywords,
            args.limit,
            compact=compact,
        )
        structured, text = render_answer(found, compact)
        result = text_result(text, is_error=False)
        result["structuredContent"] = structured
        result["_meta"] = {
            INDEX_META_KEY: {"version": found.version.number, "fingerprint": found.version.fingerprint}
        }
        return result
