"""The health ports: probes and scrapes answered outside the MCP port's Host check and the link's TLS.

In process: the router app's health port is told apart by the local port a request arrived on
(router/frontdoor/health_port.py), and the indexer's HTTP endpoint (indexer/api/probes.py) says
ready only while the gRPC server serves, and alive only while the event loop answers.
tests/system/test_kubernetes_processes.py runs both from the manifests, probed as the kubelet does.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from pathlib import Path

import httpx2
import pytest
from prometheus_client import CollectorRegistry, Counter

from commands.health_check import check_http
from indexer.api import probes
from indexer.api.probes import ProbeEndpoint
from router.frontdoor.app import create_app
from toolsearch.config import parse_config

POD_IP = "10.244.0.17"  # a Host header only: no request goes to it


def router_config(health_port: int) -> object:
    raw = {
        "router": {
            "listen": "0.0.0.0:8000",
            "health_listen": f"0.0.0.0:{health_port}",
            "allowed_hosts": ["tools.example.com"],
        }
    }
    return parse_config(raw, Path("toolsearch.yaml"))


async def test_the_routers_health_port_answers_the_kubelets_host_and_serves_nothing_else() -> None:
    app = create_app(router_config(8001), {})  # type: ignore[arg-type]
    transport = httpx2.ASGITransport(app)
    async with httpx2.AsyncClient(transport=transport) as client:
        # the URL's host and port are the request's Host and the port it arrived on, as from a kubelet
        health = await client.get(f"http://{POD_IP}:8001/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        metrics = await client.get(f"http://{POD_IP}:8001/metrics")
        assert metrics.status_code == 200 and "toolsearch_router_http_requests_total" in metrics.text
        assert (await client.post(f"http://{POD_IP}:8001/mcp", json={})).status_code == 404
        assert (await client.get(f"http://{POD_IP}:8001/status")).status_code == 404
        # the MCP port keeps its guard for the same Host, and its own routes
        refused = await client.get(f"http://{POD_IP}:8000/healthz")
        assert refused.status_code == 403 and "router.allowed_hosts" in refused.text
        assert (await client.get("http://tools.example.com/healthz")).status_code == 200


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_the_indexers_probe_endpoint_is_ready_only_while_serving_and_alive_while_its_loop_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = CollectorRegistry()
    Counter("toolsearch_indexer_example", "an example family", registry=registry).inc()
    endpoint = ProbeEndpoint("127.0.0.1:0", registry, asyncio.get_running_loop())
    base = f"http://127.0.0.1:{endpoint.port}"
    try:
        status, body = await asyncio.to_thread(get, f"{base}/readyz")
        assert status == 503 and "starting or stopping" in body  # the slow start: not serving yet
        assert await asyncio.to_thread(check_http, f"{base}/healthz", host=f"{POD_IP}:9464") is None
        endpoint.ready = True
        assert await asyncio.to_thread(check_http, f"{base}/readyz") is None
        status, body = await asyncio.to_thread(get, f"{base}/metrics")
        assert status == 200 and "toolsearch_indexer_example_total 1.0" in body
        endpoint.ready = False  # the stop begins: unready before the gRPC server drains
        assert (await asyncio.to_thread(get, f"{base}/readyz"))[0] == 503
        # a loop that does not answer is not alive: the kubelet restarts the container
        monkeypatch.setattr(probes, "LIVENESS_TIMEOUT", 0.5)
        answered = threading.Event()

        def ask() -> tuple[int, str]:
            try:
                return get(f"{base}/healthz")
            finally:
                answered.set()

        asked = asyncio.create_task(asyncio.to_thread(ask))
        # the loop blocked, as by a stuck call, until the probe has its answer
        asyncio.get_running_loop().call_soon(answered.wait, 60)
        status, body = await asked
        assert status == 503 and "did not answer within 0.5 s" in body
    finally:
        await asyncio.to_thread(endpoint.close)
