"""Observability: the router's `/metrics`, the indexer's metrics port and JSON logs of real processes.

The last tests check the parts without processes: the indexer's scrape-time families, its gRPC
interceptor, and the router's channel to a `dns:///` target.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx2
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from commands.ports import free_port
from indexer.api.metrics import IndexerMetrics, MetricsReading
from router.link.indexer_client import IndexerClient
from tests.support.processes import start_process
from tests.support.stack import CLI, HEADERS, INITIALIZE, Stack, running_stack
from tests.support.waits import wait_for
from toolsearch.logs import current_request_id, current_session
from toolsearch.v1 import indexer_pb2 as pb

TEXT_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    extra = {"indexer": {"health_listen": f"127.0.0.1:{free_port()}"}}
    with running_stack(tmp_path_factory.mktemp("metrics"), extra=extra) as running:
        yield running


Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def parse(text: str) -> Samples:
    """Every sample of an exposition text, by name and sorted labels."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def scrape(url: str) -> tuple[str, Samples]:
    """The exposition text at `url`, and its samples."""
    response = httpx2.get(url, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text, parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


async def use_both_tools(stack: Stack) -> None:
    """One find_tool, one call_tool that works and one for a tool that does not exist."""
    http = httpx2.AsyncClient()
    async with http, Client(streamable_http_client(stack.mcp_url, http_client=http), mode="legacy") as client:
        found = await client.call_tool("find_tool", {"tool_description": "cocktails with lime"})
        assert not found.is_error
        called = await client.call_tool(
            "call_tool", {"tool_name": "Search_by_ingredient", "parameters": {"ingredient": "lime"}}
        )
        assert not called.is_error
        missing = await client.call_tool("call_tool", {"tool_name": "no_such_tool", "parameters": {}})
        assert missing.is_error


async def test_the_router_counts_and_times_tool_calls_by_kind_and_outcome(stack: Stack) -> None:
    await use_both_tools(stack)
    text, samples = scrape(f"{stack.router_urls[0]}/metrics")
    calls = "toolsearch_router_tool_calls_total"
    assert value(samples, calls, tool="find_tool", outcome="ok") >= 1
    assert value(samples, calls, tool="call_tool", outcome="ok") >= 1
    assert value(samples, calls, tool="call_tool", outcome="tool_error") >= 1
    latency = "toolsearch_router_tool_call_duration_seconds_count"
    assert value(samples, latency, tool="find_tool", outcome="ok") >= 1
    http = "toolsearch_router_http_requests_total"
    assert value(samples, http, route="/mcp", method="POST", status="200") >= 4
    assert value(samples, http, route="/readyz", method="GET", status="200") >= 1
    indexer = "toolsearch_router_indexer_call_duration_seconds_count"
    for method in ("OpenSession", "GetSession", "FindTools"):  # GetSession resolves call_tool's tool
        assert value(samples, indexer, method=method, code="OK") >= 1, method
    assert value(samples, indexer, method="ResolveTool", code="NOT_FOUND") >= 1
    # bounded labels only: no backend tool name, no session id
    assert "Search_by_ingredient" not in text and "no_such_tool" not in text
    assert not re.search(r'session[^"]*="', text)


def test_every_response_carries_a_request_id(stack: Stack) -> None:
    chosen = httpx2.get(f"{stack.router_urls[0]}/healthz", headers={"X-Request-Id": "deploy-check.1"})
    assert chosen.headers["x-request-id"] == "deploy-check.1"
    made = httpx2.get(f"{stack.router_urls[0]}/healthz", headers={"X-Request-Id": 'bad id {"x": 1}'})
    assert re.fullmatch(r"[0-9a-f]{16}", made.headers["x-request-id"])


async def test_the_indexer_serves_its_families_on_the_metrics_port(stack: Stack) -> None:
    await use_both_tools(stack)
    _, samples = scrape(f"http://{stack.config['indexer']['health_listen']}/metrics")
    assert value(samples, "toolsearch_indexer_sessions") >= 0
    assert value(samples, "toolsearch_indexer_index_versions") >= 1
    assert value(samples, "toolsearch_indexer_index_versions_built_total") >= 1
    assert "toolsearch_indexer_index_versions_shared" in samples
    assert samples["toolsearch_indexer_index_version_sessions"]
    assert value(samples, "toolsearch_indexer_embedding_model_calls_total") >= 1
    misses = value(samples, "toolsearch_indexer_embedding_cache_misses_total")
    hits = value(samples, "toolsearch_indexer_embedding_cache_hits_total")
    assert misses >= 1 and hits + misses >= value(samples, "toolsearch_indexer_embedding_texts_total")
    status = "toolsearch_indexer_backend_status"
    assert value(samples, status, backend="Cocktails", status="healthy") == 1
    assert value(samples, status, backend="Cocktails", status="unhealthy") == 0
    finds = "toolsearch_indexer_rpc_duration_seconds_count"
    assert value(samples, finds, method="FindTools", code="OK") >= 2
    assert value(samples, finds, method="ResolveTool", code="NOT_FOUND") >= 1


def test_json_logs_name_the_request_and_a_session_prefix(stack: Stack, tmp_path: Path) -> None:
    port = free_port()
    proc = start_process(
        [*CLI, "router", "--config", str(stack.config_path), "--log-level", "debug", "--log-format", "json"],
        f"http://127.0.0.1:{port}/readyz",
        env={"TOOLSEARCH_ROUTER_LISTEN": f"127.0.0.1:{port}"},
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        opened = httpx2.post(
            url, json=INITIALIZE, headers={**HEADERS, "X-Request-Id": "req-init"}, timeout=10
        )
        session_id = opened.headers["mcp-session-id"]
        session = {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-11-25"}
        find = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "find_tool", "arguments": {"tool_description": "nba teams"}},
        }
        found = httpx2.post(
            url, json=find, headers={**HEADERS, **session, "X-Request-Id": "req-find"}, timeout=10
        )
        assert found.status_code == 200
    finally:
        output = proc.stop()
    lines = [line for line in output.splitlines() if line.strip()]
    assert not [line for line in lines if TEXT_LOG_LINE.match(line)], "a log line is not JSON"
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    for request_id in ("req-init", "req-find"):
        mine = [r for r in records if r.get("request_id") == request_id]
        assert mine, request_id
        assert any(r.get("session_id") == session_id[:8] for r in mine), mine
    assert session_id not in output  # the whole id is a capability: only its prefix is logged


# -- without processes ----------------------------------------------------------------------------


def test_the_indexer_families_come_from_one_snapshot_per_scrape() -> None:
    snapshot = MetricsReading(
        sessions=3,
        version_sessions={"a" * 32: 2, "b" * 32: 1, "c" * 32: 0},
        versions_built=4,
        cache_hits=10,
        cache_misses=5,
        model_calls=2,
        texts_embedded=5,
        backends={"weather": "degraded", "maps": "healthy"},
    )
    reads: list[MetricsReading] = []

    def read() -> MetricsReading:
        reads.append(snapshot)
        return snapshot

    metrics = IndexerMetrics(read)
    samples = parse(generate_latest(metrics.registry).decode())
    assert len(reads) == 1
    assert value(samples, "toolsearch_indexer_sessions") == 3
    assert value(samples, "toolsearch_indexer_index_versions") == 3
    assert value(samples, "toolsearch_indexer_index_versions_shared") == 1
    assert value(samples, "toolsearch_indexer_index_version_sessions", fingerprint="a" * 12) == 2
    assert value(samples, "toolsearch_indexer_index_versions_built_total") == 4
    assert value(samples, "toolsearch_indexer_embedding_cache_hits_total") == 10
    assert value(samples, "toolsearch_indexer_embedding_cache_misses_total") == 5
    statuses = samples["toolsearch_indexer_backend_status"]
    assert sum(statuses.values()) == 2  # exactly one current status per backend
    assert value(samples, "toolsearch_indexer_backend_status", backend="weather", status="degraded") == 1
    assert value(samples, "toolsearch_indexer_backend_status", backend="weather", status="healthy") == 0


def test_a_scrape_the_event_loop_misses_still_answers() -> None:
    def busy() -> MetricsReading:
        raise TimeoutError

    metrics = IndexerMetrics(busy)
    text = generate_latest(metrics.registry).decode()
    assert "toolsearch_indexer_rpc_duration_seconds" in text
    assert "toolsearch_indexer_sessions" not in text


async def test_a_dns_target_is_one_balanced_channel_that_works() -> None:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"dns:///127.0.0.1:{port}"
    client = IndexerClient([address], timeout=2.0)
    try:
        assert await client.check_health() == {address: "SERVING"}
        assert client.channels.tries == 2  # a failed call is retried once: the channel picks another replica
    finally:
        await client.close()
        await server.stop(None)


async def test_the_indexer_interceptor_times_calls_and_binds_their_log_context() -> None:
    metrics = IndexerMetrics(lambda: MetricsReading(0, {}, 0, 0, 0, 0, 0, {}))

    async def echo(request: pb.GetSessionRequest, context: grpc.aio.ServicerContext) -> pb.GetSessionResponse:
        if request.session_id == "missing":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such session")
        return pb.GetSessionResponse(session_id=f"{current_request_id()}|{current_session()}")

    handler = grpc.unary_unary_rpc_method_handler(
        echo,
        request_deserializer=pb.GetSessionRequest.FromString,
        response_serializer=pb.GetSessionResponse.SerializeToString,
    )
    server = grpc.aio.server(interceptors=[metrics.interceptor()])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Echo": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(
                "/test.Echo/Echo",
                request_serializer=pb.GetSessionRequest.SerializeToString,
                response_deserializer=pb.GetSessionResponse.FromString,
            )
            reply = await call(
                pb.GetSessionRequest(session_id="ABCDEFGHIJKLMNOP"), metadata=(("x-request-id", "req-7"),)
            )
            assert reply.session_id == "req-7|ABCDEFGH"
            with pytest.raises(grpc.aio.AioRpcError):
                await call(pb.GetSessionRequest(session_id="missing"))
        count = "toolsearch_indexer_rpc_duration_seconds_count"

        def observed(code: str) -> float:
            return value(parse(generate_latest(metrics.registry).decode()), count, method="Echo", code=code)

        # the client has an aborted call's status before the server's handler has returned: its
        # timing is observed just after, so wait for it rather than stop the server under it
        await wait_for(lambda: observed("NOT_FOUND") > 0)
    finally:
        await server.stop(None)
    assert observed("OK") == 1
    assert observed("NOT_FOUND") == 1
