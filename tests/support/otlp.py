"""A loopback OTLP/HTTP receiver: the spans every process of a test sends, decoded, for the test to read.

with OtlpReceiver() as receiver:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **SHORT_BATCHES}
    ...  # start processes with env, make requests
    spans = receiver.spans()
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, NamedTuple

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

# spans leave a process within a fifth of a second instead of the SDK's 5 s
SHORT_BATCHES = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_TRACES_SAMPLER": "always_on"}
KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


class Span(NamedTuple):
    service: str
    name: str
    kind: str
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a root span
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    field = any_value.WhichOneof("value")
    return getattr(any_value, field) if field else None


class OtlpReceiver:
    """`POST /v1/traces` on a free loopback port; keeps every span it is sent."""

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._keep(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            attributes = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(attributes.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    kept = Span(
                        service,
                        span.name,
                        KINDS.get(span.kind, "unspecified"),
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        {a.key: _value(a.value) for a in span.attributes},
                    )
                    with self._lock:
                        self._spans.append(kept)

    def spans(self, trace_id: str | None = None) -> list[Span]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
