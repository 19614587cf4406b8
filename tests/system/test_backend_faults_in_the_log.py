"""A backend answering garbage is one line in the indexer's log, with its reason, and no traceback.

Real processes on loopback: the catalog server, whose control API makes one server answer every MCP
request with truncated JSON or an HTML error page, and an indexer probing it every 0.3 s at the
default log level. What the indexer writes while that server answers garbage through many probes,
and after it recovers, is read from its output. Waits are on conditions with bounded timeouts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import httpx2
import pytest

from commands.ports import free_port
from tests.support.catalogs import small_catalog
from tests.support.processes import Proc, start_process
from tests.support.stack import CLI, START_TIMEOUT, grpc_ready, wait_until, write_config

WAIT = 30.0  # seconds any condition may take at most
WEATHER = "AI_Weather_by_Meteosource"
PROBES = 5  # probes the garbling server answers before it recovers


@dataclass
class Probed:
    catalog_url: str
    indexer: Proc

    def control(self, action: str) -> None:
        httpx2.post(f"{self.catalog_url}/control/servers/{WEATHER}/{action}", timeout=5).raise_for_status()

    def requests(self) -> int:
        """The MCP requests the garbling server has received (each probe sends two or more)."""
        answer = httpx2.get(f"{self.catalog_url}/control/servers/{WEATHER}/calls", timeout=5)
        return int(answer.json()["requests"])


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probed]:
    workdir = tmp_path_factory.mktemp("garbage")
    catalog = workdir / "catalog.jsonl"
    small_catalog(catalog)
    catalog_port, indexer_port = free_port(), free_port()
    health = {"interval": 0.3, "timeout": 2.0, "unhealthy_after": 1}
    config_path, _ = write_config(
        workdir, catalog, catalog_port, indexer_port, free_port(), {"indexer": {"health": health}}
    )
    with ExitStack() as cleanup:
        args = [*CLI, "catalog-server", "--catalog", str(catalog), "--port", str(catalog_port), "--control"]
        catalog_url = f"http://127.0.0.1:{catalog_port}"
        cleanup.callback(start_process(args, f"{catalog_url}/healthz").stop)
        indexer = start_process([*CLI, "indexer", "--config", str(config_path)], None)
        cleanup.callback(indexer.stop)
        wait_until(lambda: grpc_ready(f"127.0.0.1:{indexer_port}"), START_TIMEOUT, indexer)
        yield Probed(catalog_url, indexer)


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [("json", "answered invalid JSON (EOF while parsing"), ("html", "text/html")],
    ids=["truncated-json", "html-page"],
)
def test_a_backend_answering_garbage_is_one_line_each_way_with_its_reason_and_no_traceback(
    probed: Probed, garbage: str, reason: str
) -> None:
    start = len(probed.indexer.output())

    def since() -> str:
        return probed.indexer.output()[start:]

    probed.control(f"garble?as={garbage}")
    try:
        wait_until(lambda: f"backend {WEATHER}: healthy -> unhealthy: " in since(), WAIT, probed.indexer)
        counted = probed.requests()
        wait_until(lambda: probed.requests() >= counted + 2 * PROBES, WAIT, probed.indexer)
    finally:
        probed.control("garble?as=off")
    wait_until(lambda: f"backend {WEATHER}: degraded -> healthy: " in since(), WAIT, probed.indexer)
    logged = since()
    changes = [line for line in logged.splitlines() if f"backend {WEATHER}: " in line]
    assert [line.split(f"backend {WEATHER}: ")[1].split(":")[0] for line in changes] == [
        "healthy -> unhealthy",
        "unhealthy -> degraded",
        "degraded -> healthy",
    ], logged
    assert reason in changes[0], changes[0]
    assert "Traceback" not in logged and "mcp.client" not in logged, logged
