"""Soak: 32 clients calling find_tool and call_tool while two backends flap and the indexer restarts.

With the memory state the restart loses every session: clients see 503 while the indexer is away,
then 404, and open new sessions. With the Redis state and two indexer replicas, the routers fail
over to the other replica and the restarted one serves the same sessions: clients see no error.
Nothing goes unanswered (no call outlives its bound, no failure is anything but those clear
errors), every client is served again, and the memory of the router and the new indexer stays flat
over the steady phase. `TOOLSEARCH_SOAK_SECONDS` sets that phase's length (default 15; e.g. 60 for
a longer run). The figures are printed and written to `soak-<state>.json` in the stack's folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.catalogs import small_catalog
from tests.support.redis import running_redis
from tests.support.soak import SoakReport, soak
from tests.support.stack import Stack, running_stack

SOAK_SECONDS = float(os.environ.get("TOOLSEARCH_SOAK_SECONDS", "15"))
CLIENTS = 32
FLAPPING = ("Free_NBA", "AI_Weather_by_Meteosource")
MAX_GROWTH_MB = 50.0
HEALTH = {"interval": 0.5, "timeout": 1.0, "unhealthy_after": 1}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("soak")
    small_catalog(folder / "catalog.jsonl")
    extra = {"indexer": {"health": HEALTH}}
    with running_stack(folder, catalog=folder / "catalog.jsonl", extra=extra, backend_timeout=5.0) as running:
        yield running


def publish(report: SoakReport, stack: Stack, name: str, record_property: pytest.RecordProperty) -> None:
    """Print the figures and keep them with the test's output."""
    figures = report.as_dict()
    text = json.dumps(figures, indent=2, sort_keys=True)
    print(f"soak ({name}):\n{text}")
    (stack.workdir / f"soak-{name}.json").write_text(text + "\n", encoding="utf-8")
    record_property(f"soak-{name}", json.dumps(figures, sort_keys=True))


def assert_served(report: SoakReport) -> None:
    """What every state backend guarantees: answers within the bound, clear errors only, flat memory."""
    assert report.outcomes["hung"] == 0, report.as_dict()
    assert report.warmed_clients == report.clients, report.as_dict()  # the disruption met calls in flight
    assert not report.unexpected, report.unexpected
    assert report.recovered_clients == report.clients, report.as_dict()
    assert report.outcomes["ok"] > 10 * report.clients, report.as_dict()
    # a flapping backend's calls fail as the model is told: the tool is gone, or the backend is down
    assert set(report.tool_errors) <= {"tool not found", "backend answered HTTP 503"}, report.tool_errors
    for process in report.rss_mb["end"]:
        assert report.growth_mb(process) < MAX_GROWTH_MB, report.as_dict()
    assert report.growth_mb("router0", since="warm") < MAX_GROWTH_MB, report.as_dict()


async def test_soak_with_the_memory_state(stack: Stack, record_property: pytest.RecordProperty) -> None:
    report = await soak(stack, SOAK_SECONDS, clients=CLIENTS, flapping=FLAPPING)
    publish(report, stack, "memory", record_property)
    assert_served(report)
    # the restart lost the sessions: clients were told so (404) and opened new ones
    assert report.outcomes["session_lost"] > 0
    assert report.sessions_opened > CLIENTS


async def test_soak_with_the_redis_state_and_two_replicas_sees_no_errors(
    tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    small_catalog(tmp_path / "catalog.jsonl")
    extra = {"indexer": {"health": HEALTH, "lease_ttl": 1.0}}
    with (
        running_redis(tmp_path / "redis") as redis,
        running_stack(
            tmp_path,
            catalog=tmp_path / "catalog.jsonl",
            extra=extra,
            env={"TOOLSEARCH_INDEXER_STATE": redis.url},
            backend_timeout=5.0,
            replicas=2,
        ) as stack,
    ):
        report = await soak(stack, SOAK_SECONDS, clients=CLIENTS, flapping=FLAPPING)
        publish(report, stack, "redis", record_property)
    assert_served(report)
    # the other replica answered while one restarted, and the sessions outlived the restart
    assert report.outcomes["session_lost"] == 0, report.as_dict()
    assert report.outcomes["unavailable"] == 0, report.as_dict()
    assert report.sessions_opened == CLIENTS, report.as_dict()
