"""Traces: one trace per MCP request across router, indexer and backend, sent to a loopback receiver.

The real stack (catalog server, indexer, router), each process told by `OTEL_*` variables where to
send its spans; the client's own `traceparent` starts the trace. Without those variables nothing
is sent at all.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.support.catalogs import small_catalog
from tests.support.otlp import SHORT_BATCHES, OtlpReceiver, Span
from tests.support.stack import HEADERS, Stack, open_session, running_stack
from toolsearch.tracing import tracing_wanted

WAIT = 30.0
ARGUMENT = "a-secret-argument-value"
TOKENISH = "Bearer not-for-traces"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, OtlpReceiver]]:
    catalog = tmp_path_factory.mktemp("traces-catalog") / "catalog.jsonl"
    small_catalog(catalog)
    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **SHORT_BATCHES}
        with running_stack(tmp_path_factory.mktemp("traces"), catalog=catalog, env=env) as stack:
            yield stack, receiver


def post(stack: Stack, session_id: str, body: dict[str, object], traceparent: str) -> httpx2.Response:
    headers = {**HEADERS, "Mcp-Session-Id": session_id, "traceparent": traceparent}
    return httpx2.post(stack.mcp_url, json=body, headers=headers, timeout=WAIT)


def trace_of(receiver: OtlpReceiver, trace_id: str, services: set[str], names: set[str]) -> list[Span]:
    """The trace's spans once every service has sent and every named span is in, within WAIT."""
    deadline = time.monotonic() + WAIT
    while True:
        spans = receiver.spans(trace_id)
        if services <= {s.service for s in spans} and names <= {s.name for s in spans}:
            return spans
        assert time.monotonic() < deadline, sorted((s.service, s.name) for s in spans)
        time.sleep(0.05)


def one(spans: list[Span], service: str, name: str) -> Span:
    matching = [s for s in spans if s.service == service and s.name == name]
    assert len(matching) == 1, (service, name, [(s.service, s.name) for s in spans])
    return matching[0]


def parent_of(spans: list[Span], span: Span) -> Span:
    return next(s for s in spans if s.span_id == span.parent_id)


def test_a_call_tool_is_one_trace_from_the_clients_traceparent_through_the_indexer_to_the_backend(
    traced: tuple[Stack, OtlpReceiver],
) -> None:
    stack, receiver = traced
    session_id = open_session(stack.mcp_url)
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {
            "name": "call_tool",
            "arguments": {"tool_name": "Search_by_name", "parameters": {"name": ARGUMENT}},
        },
    }
    answer = post(stack, session_id, call, f"00-{trace_id}-{client_span}-01")
    assert answer.status_code == 200 and "error" not in answer.json(), answer.text
    router, indexer, backend = "toolsearch-router", "toolsearch-indexer", "toolsearch-catalog-server"
    names = {"POST /mcp", "tools/call call_tool", "indexer GetSession"}
    spans = trace_of(receiver, trace_id, {router, indexer, backend}, names)
    # the router's request span is the child of the client's, the SDK's span for the method its child
    request = one(spans, router, "POST /mcp")
    assert request.kind == "server" and request.parent_id == client_span
    assert one(spans, router, "tools/call call_tool").parent_id == request.span_id
    attributes = request.attributes
    assert (
        attributes["toolsearch.tool"] == "call_tool" and attributes["toolsearch.target"] == "Search_by_name"
    )
    assert attributes["toolsearch.backend"] == "Cocktails" and attributes["toolsearch.outcome"] == "ok"
    assert str(attributes["toolsearch.index_version"]).startswith("v")
    # router -> indexer: the indexer's span is the child of the router's call span, over gRPC metadata
    resolved = one(spans, indexer, "indexer GetSession")  # the session check resolves the tool too
    caller = parent_of(spans, resolved)
    assert (caller.service, caller.name, caller.kind) == (router, "indexer GetSession", "client")
    assert parent_of(spans, caller).span_id in {s.span_id for s in spans if s.service == router}
    # router -> backend: the backend's MCP server span is in the same trace, under a router span
    served = [s for s in spans if s.service == backend and s.kind == "server"]
    assert served, [(s.service, s.name) for s in spans]
    assert all(parent_of(spans, s).service == router for s in served)
    assert any(s.name == "backend Cocktails" and s.kind == "client" for s in spans if s.service == router)
    # no argument value and no credential in any attribute
    values = " ".join(str(v) for s in receiver.spans() for v in s.attributes.values())
    assert ARGUMENT not in values and "Bearer" not in values


def test_find_tool_has_spans_for_the_embedding_and_the_search_under_the_indexers_call(
    traced: tuple[Stack, OtlpReceiver],
) -> None:
    stack, receiver = traced
    session_id = open_session(stack.mcp_url)
    trace_id = secrets.token_hex(16)
    find = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "find_tool", "arguments": {"tool_description": "a cocktail recipe with rum"}},
    }
    answer = post(stack, session_id, find, f"00-{trace_id}-{secrets.token_hex(8)}-01")
    assert answer.status_code == 200
    spans = trace_of(
        receiver, trace_id, {"toolsearch-indexer"}, {"embed query", "search", "indexer FindTools"}
    )
    found = one(spans, "toolsearch-indexer", "indexer FindTools")
    for name in ("embed query", "search"):
        assert one(spans, "toolsearch-indexer", name).parent_id == found.span_id
    assert one(spans, "toolsearch-indexer", "search").attributes["toolsearch.hits"] >= 1


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_traces_are_off_unless_the_standard_variables_ask_for_them(
    environ: dict[str, str], wanted: bool
) -> None:
    assert tracing_wanted(environ) is wanted


def test_with_the_exporter_set_to_none_no_process_sends_a_span(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.jsonl"
    small_catalog(catalog)
    (tmp_path / "stack").mkdir()
    with OtlpReceiver() as receiver:
        # the endpoint is this receiver's, but OTEL_TRACES_EXPORTER=none keeps every process quiet
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_TRACES_EXPORTER": "none",
            **SHORT_BATCHES,
        }
        with running_stack(tmp_path / "stack", catalog=catalog, env=env) as stack:
            open_session(stack.mcp_url)
            for proc in stack.procs.values():
                proc.stop()  # a process that traced would flush its spans as it exits
        assert receiver.spans() == []
