"""The SDK's MCP server behind `/mcp`: which method each handler answers, and the caching hints.

The session layer (router/frontdoor/session_layer.py) answers a few requests in front of it
(router/frontdoor/direct_calls.py) and hands it the rest. `tools/call` and the resource and prompt
methods are registered as plain request handlers, so that a backend's entries and results reach
the client as the wire had them (router/handlers/passthrough.py), not re-shaped by the SDK.
"""

from __future__ import annotations

from typing import Any

from mcp.server.caching import CacheHint
from mcp.server.lowlevel.server import Server
from mcp_types import (
    CallToolRequestParams,
    CompleteRequestParams,
    GetPromptRequestParams,
    PaginatedRequestParams,
    ReadResourceRequestParams,
    SetLevelRequestParams,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    UnsubscribeRequestParams,
)

from router.handlers.listens import Listens
from router.handlers.log_levels import LogLevels
from router.handlers.meta_tools import MetaTools
from router.handlers.passthrough import PassThroughMiddleware, holding
from router.handlers.prompts import Prompts
from router.handlers.resources import Resources
from router.observe.access_log import AccessLog
from router.observe.metrics import RouterMetrics
from toolsearch.outgoing import VERSION

INSTRUCTIONS = (
    "This server fronts many tools through two: find_tool searches them by what you need done and "
    "returns the best matches with their input schemas; call_tool runs one of them by name."
)
# The two meta-tools never change while the router runs, so clients may keep the list a while.
_TOOLS_LIST_HINT = CacheHint(ttl_ms=600_000, scope="public")
# Resources and prompts are the session's backends', which health changes at any moment: stale at
# once, and never shared across callers.
_SESSION_HINT = CacheHint(ttl_ms=0, scope="private")


def build_server(
    tools: MetaTools,
    metrics: RouterMetrics | None = None,
    resources: Resources | None = None,
    prompts: Prompts | None = None,
    logs: LogLevels | None = None,
    listens: Listens | None = None,
) -> Server[Any]:
    """The MCP server behind `/mcp`: `tools/list` and `tools/call` answered by the meta-tools, and,
    with `resources` and `prompts`, the resource, prompt and completion methods over the session's
    backends, with `logs`, `logging/setLevel`, and with `listens`, 2026-07-28 `subscriptions/listen`
    (each of which the SDK then advertises in its capabilities).

    With `metrics`, every `tools/call` is counted and timed.
    """
    server: Server[Any] = Server(
        "toolsearch",
        version=VERSION,
        instructions=INSTRUCTIONS,
        cache_hints={
            "tools/list": _TOOLS_LIST_HINT,
            "resources/list": _SESSION_HINT,
            "resources/templates/list": _SESSION_HINT,
            "resources/read": _SESSION_HINT,
            "prompts/list": _SESSION_HINT,
        },
        get_tool_input_schema=tools.input_schema,
        on_list_tools=tools.list_tools,
    )
    # Registered directly so the handler may return the wire dict it built (find_tool's answer).
    handler = metrics.observe_tool_calls(tools.call_tool) if metrics is not None else tools.call_tool
    # a backend's result is answered as it came, around the SDK's shaping (router/handlers/passthrough.py)
    server.middleware.append(PassThroughMiddleware())
    server.add_request_handler(
        "tools/call", CallToolRequestParams, holding(AccessLog.observe_tool_calls(handler))
    )
    # Registered directly too: the backends' entries and results pass through as the wire had them.
    if resources is not None:
        server.add_request_handler("resources/list", PaginatedRequestParams, resources.list_resources)
        server.add_request_handler(
            "resources/templates/list", PaginatedRequestParams, resources.list_templates
        )
        server.add_request_handler("resources/read", ReadResourceRequestParams, holding(resources.read))
        server.add_request_handler(
            "resources/subscribe", SubscribeRequestParams, holding(resources.subscribe)
        )
        server.add_request_handler(
            "resources/unsubscribe", UnsubscribeRequestParams, holding(resources.unsubscribe)
        )
    if prompts is not None:
        server.add_request_handler("prompts/list", PaginatedRequestParams, prompts.list_prompts)
        server.add_request_handler("prompts/get", GetPromptRequestParams, holding(prompts.get_prompt))
        server.add_request_handler("completion/complete", CompleteRequestParams, prompts.complete)
    if logs is not None:
        server.add_request_handler("logging/setLevel", SetLevelRequestParams, logs.set_level)
    if listens is not None:
        server.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, listens.listen)
    return server
