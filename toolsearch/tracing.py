"""OpenTelemetry traces, configured by the standard `OTEL_*` environment variables, off when unset.

    configure_tracing("toolsearch-router", os.environ)   # at a service's start; True when on

Traces are on when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, or
`OTEL_TRACES_EXPORTER=otlp`; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keeps them off.
Spans then go to an OTLP receiver over HTTP/protobuf (the exporter reads its own endpoint, headers,
timeout and compression variables); `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` name the
service, which defaults to the part's own name. Off, nothing of the SDK is imported and every span
is the API's no-op.

Context crosses the link as W3C `traceparent`/`tracestate`: in gRPC metadata from the router to the
indexer (`inject_metadata`, `extract_metadata`), in HTTP headers from the router to the backends.
Both sides name an indexer call by its method alone (`rpc_name`), in spans and metrics alike.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate

logger = logging.getLogger(__name__)

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def rpc_name(method: str | bytes) -> str:
    """A gRPC method's own name (`FindTools` of `/toolsearch.v1.Indexer/FindTools`), "unknown" for none."""
    text = method.decode() if isinstance(method, bytes) else method
    return text.rpartition("/")[2] or "unknown"


def tracing_wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces (see the module's docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return exporter == "otlp" or any(environ.get(name, "").strip() for name in _ENDPOINTS)


def configure_tracing(service: str, environ: Mapping[str, str]) -> bool:
    """Install a tracer provider exporting over OTLP/HTTP when the environment asks; True when it did."""
    if not tracing_wanted(environ):
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if exporter != "otlp" or (protocol and protocol != "http/protobuf"):
        logger.warning(
            "traces: only OTLP over http/protobuf is supported (OTEL_TRACES_EXPORTER=%s, protocol %s): "
            "no traces are sent",
            exporter,
            protocol or "default",
        )
        return False
    # imported only here: a process without traces never loads the SDK
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by Resource.create; ours is the default
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # flushed at exit
    trace.set_tracer_provider(provider)
    logger.info("traces: sending spans over OTLP as %s", attributes.get("service.name", "OTEL_SERVICE_NAME"))
    return True


def inject_metadata(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """gRPC metadata `pairs` with the current trace context added (unchanged when none is recording)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [*pairs, *carrier.items()]


def extract_metadata(pairs: Iterable[tuple[str, str | bytes]]) -> otel_context.Context:
    """The trace context gRPC metadata carries (the current context when it carries none)."""
    carrier = {key: value for key, value in pairs if isinstance(value, str)}
    return propagate.extract(carrier)
