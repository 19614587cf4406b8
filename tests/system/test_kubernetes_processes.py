"""The rendered Kubernetes manifests run: each container's command, environment and probes, locally.

No cluster is needed: tests/support/pods.py maps what the cluster gives a container (Services,
mounts, Secrets) to loopback, folders and the given secrets, then runs the container's command
and its probes within their own budgets, as the kubelet sends them (Host: the pod's IP). An MCP
client then gets find_tool and call_tool answers through the router, as it would through the
Service. The scaled overlay runs against real redis-server and sentinel processes
(tests/support/sentinel.py) in place of the Redis pods; the scaled and managed-redis overlays'
router-indexer link runs over mutual TLS with the certificates their Certificates ask cert-manager
for (tests/support/cert_manager.py issues them here).
"""

from __future__ import annotations

import json
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.health_check import check_grpc, check_http
from tests.support.cert_manager import issue
from tests.support.kubernetes import render
from tests.support.pods import POD_IP, LocalCluster, memory_bytes, tree_rss
from tests.support.sentinel import running_sentinels

INDEXER_SECRET = secrets.token_hex(16)
REDIS_PASSWORD = secrets.token_hex(16)
STARTED = ("catalog", "bridge", "indexer", "router")  # in the order readiness lets them serve


def secrets_for(overlay: str) -> dict[tuple[str, str], str]:
    """The Secret an operator creates before applying the overlay (docs/kubernetes.md)."""
    given = {("toolsearch-secrets", "indexer-secret"): INDEXER_SECRET}
    if overlay == "scaled":
        given[("toolsearch-secrets", "redis-password")] = REDIS_PASSWORD
    return given


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(render("small"), tmp_path_factory.mktemp("small"), secrets_for("small"))
    try:
        for name in STARTED:
            cluster.start("Deployment", name)
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    folder = tmp_path_factory.mktemp("scaled")
    with running_sentinels(folder / "redis", replicas=2, password=REDIS_PASSWORD) as group:
        # the pods redis-0..2 of the StatefulSet, each a sentinel: here the three local sentinels
        pods = {f"redis-{n}.redis:26379": f"127.0.0.1:{port}" for n, port in enumerate(group.sentinels)}
        manifests = render("scaled")
        certificates = issue(manifests, folder / "certificates")
        cluster = LocalCluster(
            manifests, folder, secrets_for("scaled"), hosts=pods, secret_folders=certificates
        )
        try:
            for name in STARTED:
                cluster.start("Deployment", name)
            yield cluster
        finally:
            cluster.stop_all()


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    folder = tmp_path_factory.mktemp("managed")
    with running_sentinels(folder / "redis", replicas=0, password=REDIS_PASSWORD) as group:
        given = {
            **secrets_for("scaled"),
            ("toolsearch-secrets", "redis-url"): f"redis://127.0.0.1:{group.primary}/0",
        }
        manifests = render("managed-redis")
        certificates = issue(manifests, folder / "certificates")
        cluster = LocalCluster(manifests, folder, given, secret_folders=certificates)
        try:
            for name in STARTED:
                cluster.start("Deployment", name)
            yield cluster
        finally:
            cluster.stop_all()


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result
    data = result.structured_content
    assert isinstance(data, dict), result
    return data


async def find_and_call_the_time(cluster: LocalCluster) -> dict[str, Any]:
    """find_tool for the time in a zone, then call_tool on what it found, through the router."""
    url = cluster.url("router", 8000, "/mcp")
    async with (
        httpx2.AsyncClient(timeout=30) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        found = structured(
            await client.call_tool("find_tool", {"tool_description": "the current time in a time zone"})
        )
        names = [tool["name"] for tool in found["tools"]]
        (name,) = [n for n in names if n.endswith("get_current_time")]
        called = await client.call_tool(
            "call_tool", {"tool_name": name, "parameters": {"timezone": "Asia/Tokyo"}}
        )
        assert not called.is_error, called
        answer = json.loads(called.content[0].text)
        assert answer["timezone"] == "Asia/Tokyo"
        weather = structured(
            await client.call_tool("find_tool", {"tool_description": "weather forecast for a city"})
        )
        assert weather["tools"], "the example catalog's servers are backends too"
        return answer


def limits_hold(cluster: LocalCluster) -> dict[str, tuple[float, float]]:
    """Each process's resident memory (MB, with its children) against its container's limit."""
    figures = {}
    for name, proc in cluster.procs.items():
        (container,) = cluster.manifests.containers(
            cluster.manifests.one("Deployment", name.rstrip("0123456789"))
        )
        limit = memory_bytes(container["resources"]["limits"]["memory"])
        rss = tree_rss(proc.pid)
        figures[name] = (rss / 1e6, limit / 1e6)
        assert 0 < rss < limit, f"{name}: {rss / 1e6:.0f} MB resident, over the limit of {limit / 1e6:.0f} MB"
    print("resident MB / limit MB:", {k: f"{v[0]:.0f} / {v[1]:.0f}" for k, v in figures.items()})
    return figures


async def test_the_small_overlays_containers_answer_find_tool_and_call_tool(small: LocalCluster) -> None:
    await find_and_call_the_time(small)
    limits_hold(small)


async def test_the_scaled_overlays_containers_keep_sessions_in_redis_through_the_sentinels(
    scaled: LocalCluster,
) -> None:
    await find_and_call_the_time(scaled)
    limits_hold(scaled)
    indexer_log = scaled.procs["indexer"].output()
    assert "redis+sentinel://127.0.0.1:" in indexer_log  # the state it logged at start
    assert REDIS_PASSWORD not in indexer_log and INDEXER_SECRET not in indexer_log


def test_the_indexer_of_the_scaled_overlay_takes_only_routers_with_a_certificate_of_the_links_ca(
    scaled: LocalCluster,
) -> None:
    grpc_port = scaled.hosts["indexer:50051"]
    # no client certificate, no connection: the gRPC health service included, which is why the
    # probes and Prometheus go to the plain HTTP health port instead
    assert check_grpc(grpc_port, timeout=5) is not None
    health = scaled.ports[9464]
    assert check_http(f"http://127.0.0.1:{health}/readyz", host=f"{POD_IP}:9464") is None
    assert "toolsearch_indexer_sessions" in httpx2.get(f"http://127.0.0.1:{health}/metrics").text


async def test_the_managed_redis_overlays_containers_use_the_redis_its_secret_names(
    managed: LocalCluster,
) -> None:
    await find_and_call_the_time(managed)
    assert "redis://127.0.0.1:" in managed.procs["indexer"].output()


def test_a_sigterm_ends_each_container_within_the_grace_period_the_kubelet_gives_it(tmp_path: Path) -> None:
    cluster = LocalCluster(render("small"), tmp_path, secrets_for("small"))
    try:
        for name in STARTED:
            cluster.start("Deployment", name)
        exits = {}
        for name in reversed(STARTED):
            workload = cluster.manifests.one("Deployment", name)
            (container,) = cluster.manifests.containers(workload)
            pause = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
            grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] - pause
            proc = cluster.procs.pop(name)
            output = proc.stop(timeout=grace)  # SIGKILL only if it outlives what the kubelet allows
            exits[name] = proc.returncode
            # 0, or the SIGTERM itself re-raised once the server has shut down (uvicorn does, for
            # the bridge); a SIGKILL (-9) would mean it outlived the grace the kubelet gives it
            assert proc.returncode in (0, -signal.SIGTERM), f"{name} exited {proc.returncode}:\n{output}"
        assert signal.SIGKILL not in {-code for code in exits.values() if code is not None}
    finally:
        cluster.stop_all()


def test_a_router_with_allowed_hosts_passes_the_kubelets_probes_on_its_health_port(tmp_path: Path) -> None:
    manifests = render("small")
    # as the ConfigMap's comment advises: the names clients reach the router by
    (config_map,) = [
        m for m in manifests.of_kind("ConfigMap") if m["metadata"]["name"].startswith("toolsearch-")
    ]
    text = config_map["data"]["toolsearch.yaml"]
    config_map["data"]["toolsearch.yaml"] = text.replace(
        "  # allowed_hosts: [tools.example.com]", "  allowed_hosts: [tools.example.com]"
    )
    assert config_map["data"]["toolsearch.yaml"] != text
    cluster = LocalCluster(manifests, tmp_path, secrets_for("small"))
    try:
        cluster.start("Deployment", "indexer")
        # started and waited on its startup, readiness and liveness probes, each sent as the
        # kubelet sends it: to the health port, with the pod's IP as Host
        cluster.start("Deployment", "router")
        health, mcp = cluster.ports[8001], cluster.ports[8000]
        for path in ("/healthz", "/readyz", "/metrics"):
            assert check_http(f"http://127.0.0.1:{health}{path}", host=f"{POD_IP}:8001") is None, path
        # the MCP port keeps its guard: the pod's IP is not a name the router answers to there
        refused = httpx2.get(f"http://127.0.0.1:{mcp}/healthz", headers={"Host": f"{POD_IP}:8000"})
        assert refused.status_code == 403 and "router.allowed_hosts" in refused.text
        allowed = httpx2.get(f"http://127.0.0.1:{mcp}/healthz", headers={"Host": "tools.example.com"})
        assert allowed.status_code == 200
        # and the health port serves nothing else: no MCP endpoint behind a rebinding page's Host
        assert httpx2.post(f"http://127.0.0.1:{health}/mcp", json={}).status_code == 404
    finally:
        cluster.stop_all()


def test_a_missing_required_secret_keeps_the_container_from_starting(tmp_path: Path) -> None:
    manifests = render("scaled")
    certificates = issue(manifests, tmp_path / "certificates")
    cluster = LocalCluster(
        manifests, tmp_path, secrets_for("small"), secret_folders=certificates
    )  # no redis-password
    with pytest.raises(AssertionError, match="Secret toolsearch-secrets has no redis-password"):
        cluster.start("Deployment", "indexer")


def test_a_certificate_secret_not_issued_yet_keeps_the_pod_from_starting(tmp_path: Path) -> None:
    # before cert-manager has written indexer-tls, the kubelet cannot mount it
    with pytest.raises(AssertionError, match="no Secret indexer-tls"):
        LocalCluster(render("scaled"), tmp_path, secrets_for("scaled"))
