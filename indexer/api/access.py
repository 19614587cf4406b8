"""Who may call the indexer: the shared-secret check in front of every service but health.

`SharedSecretGuard` is a gRPC server interceptor. It is the transport's boundary, and the one place
besides `indexer/api/status_codes.py` that chooses a status code (UNAUTHENTICATED): a call it refuses never
reaches a servicer, so the servicer's translation cannot see it. The comparison takes constant time
(`hmac.compare_digest`), and neither the expected nor the presented secret is ever logged.

The standard health service (`grpc.health.v1.Health`) stays open: container healthchecks, load
balancers and `toolsearch health grpc` probe it without credentials, and its answer (SERVING or
not) gives nothing away. Reflection, which describes the API, needs the secret like the rest.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

import grpc

logger = logging.getLogger(__name__)

OPEN_METHODS = ("/grpc.health.v1.Health/",)  # prefixes of methods anyone may call
REFUSED = "this indexer requires its shared secret: authorization: Bearer <secret>"

# one factory per (request streaming, response streaming) shape, so a refusal matches the method's
_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def _method(details: Any) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


async def _refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)


class SharedSecretGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Lets a call through only when its metadata carries `authorization: Bearer <secret>`."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the shared secret must not be empty")
        self._secret = secret.encode()

    def __repr__(self) -> str:
        return "SharedSecretGuard(secret=<hidden>)"

    def presented(self, metadata: Any) -> bool:
        """Whether any `authorization` entry of `metadata` is `Bearer <the secret>`."""
        matched = False
        for key, value in metadata or ():
            if key != "authorization" or not isinstance(value, str):
                continue
            scheme, _, token = value.partition(" ")
            equal = hmac.compare_digest(token.strip().encode(), self._secret)
            # every entry is compared, so the time taken does not tell which one matched
            matched |= scheme.lower() == "bearer" and equal
        return matched

    async def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        method = _method(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(OPEN_METHODS):
            return handler
        if self.presented(handler_call_details.invocation_metadata):
            return handler
        logger.warning("refused a call to %s: no valid shared secret", method)
        factory = _FACTORIES[(bool(handler.request_streaming), bool(handler.response_streaming))]
        return factory(
            _refuse,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
