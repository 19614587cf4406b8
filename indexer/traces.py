"""The indexer's spans: one SERVER span per gRPC call, a child of the router's span that made it.

The router sends its trace context in the call's metadata (toolsearch/tracing.py); this interceptor
reads it and runs the call inside a span named for the method, so the spans the call makes (find_tool's
embedding and search, indexer/api/finder.py) join the request's trace. With traces off every span is the
API's no-op and the call runs as it would without the interceptor.
"""

from __future__ import annotations

import inspect
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from toolsearch.tracing import extract_metadata, rpc_name

tracer = trace.get_tracer("toolsearch.indexer")


def rpc_attributes(method: str) -> dict[str, str]:
    """The semantic-convention attributes of a call of the Indexer service's `method`."""
    return {"rpc.system": "grpc", "rpc.service": "toolsearch.v1.Indexer", "rpc.method": method}


class RpcSpans(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """A SERVER span around each unary call, its parent taken from the call's metadata."""

    async def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        inner = getattr(handler, "unary_unary", None)
        if inner is None or not inspect.iscoroutinefunction(inner):
            return handler  # streams (reflection, health watches) and unknown methods pass untouched
        name = rpc_name(handler_call_details.method)
        parent = extract_metadata(handler_call_details.invocation_metadata or ())

        async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
            with tracer.start_as_current_span(
                f"indexer {name}", context=parent, kind=SpanKind.SERVER, record_exception=False
            ) as span:
                span.set_attributes(
                    {"rpc.system": "grpc", "rpc.service": "toolsearch.v1.Indexer", "rpc.method": name}
                )
                try:
                    return await inner(request, context)
                finally:
                    code = context.code()
                    if code is not None and code != grpc.StatusCode.OK:
                        span.set_status(StatusCode.ERROR, getattr(code, "name", str(code)))

        return grpc.unary_unary_rpc_method_handler(
            traced,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
