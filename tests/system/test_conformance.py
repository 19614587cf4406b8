"""The MCP conformance suite, directly and through toolsearch: what a server does reaches the client.

The suite's server scenarios of both requirement sets (2025-11-25 and 2026-07-28) run against the
project's conformance test server (tests/support/conformance_server.py) directly, and through
toolsearch: an indexer and a router as processes, the test server their one backend besides a small
catalog, every one of its tools pinned (`router.pinned: ["conf/*"]`) so that the suite reaches its
tools, resources and prompts through the router. And through replicas: two indexers sharing a Redis
and two routers, the suite's client talking to the first router while each answer it posts (to a
backend's request of it), and each 2026-07-28 request it retries with answers, reaches the second
(tests/support/split_proxy.py), with the same server over HTTP behind them, and over stdio behind
the bridge: once with the stdio backend as configured by default (the bridge speaks the handshake
era to it), once configured as a 2026-07-28 server (`protocol: 2026-07-28`, held to that requirement
set), and once with `isolation: per_session` (a process per backend session), on the input-required
scenarios. The same server on the TypeScript SDK (tests/servers/conformance-server.mjs, 2025-11-25
only) goes through one router, through the replicas over HTTP, and over stdio through the replicas
and the bridge: the relays are the protocol's, not one SDK's. Every scenario that passes directly
must pass through toolsearch each way; those that cannot are strict xfails, each naming why (only
through the bridge to a handshake-era stdio server), so the list shrinks as the gateway learns. The
runs go at once, but each bridge's in turn, and the 2026-07-28 bridge's and the HTTP servers' behind
the replicas last, alone; docs/gateway.md records the counts.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from commands.ports import free_port
from tests.support.bridges import running_bridge
from tests.support.catalogs import small_catalog
from tests.support.conformance import (
    REQUIREMENTS,
    Outcome,
    missing,
    run_scenario,
    run_suite,
    server_scenarios,
    typescript_conformance_server,
    typescript_server_args,
)
from tests.support.conformance import (
    conformance_server as running_conformance_server,
)
from tests.support.redis import running_redis
from tests.support.split_proxy import SplitProxy, split_proxy
from tests.support.stack import ROOT, Stack, running_stack

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

# What toolsearch does not relay yet, by requirement set and scenario: a strict xfail each
NOT_RELAYED: dict[tuple[str, str], str] = {}

REPLICAS = "replicas"  # the server over HTTP behind two routers, two indexers and Redis
BRIDGED = "replicas and the bridge"  # the same, the server over stdio behind the bridge
BRIDGED_MODERN = "replicas and a 2026-07-28 bridge"  # the same, the bridge speaking 2026-07-28 to its server
BRIDGED_PER_SESSION = "replicas and a per_session bridge"  # the same, a process for each backend session
# the same server on the TypeScript SDK: directly, through one router, through the replicas over HTTP,
# and over stdio through the replicas and the bridge
TYPESCRIPT = "typescript"
TYPESCRIPT_THROUGH = "toolsearch to typescript"
TYPESCRIPT_REPLICAS = "replicas to typescript"
TYPESCRIPT_BRIDGED = "replicas and the bridge to typescript"
# run in turn, not beside the others
ONE_AT_A_TIME = (
    REPLICAS,
    BRIDGED,
    BRIDGED_MODERN,
    BRIDGED_PER_SESSION,
    TYPESCRIPT_REPLICAS,
    TYPESCRIPT_BRIDGED,
)
# the requirement sets each target is held to: a stdio backend configured as a 2026-07-28 server is
# spoken to in that protocol only, which has no requests of the client and no resources/subscribe,
# so what the 2025-11-25 set asks of those is not the gateway's to give (docs/gateway.md); the
# TypeScript SDK's server speaks 2025-11-25 and earlier
HANDSHAKE_ONLY = ("2025-11-25",)
HELD_TO: dict[str, tuple[str, ...]] = {
    BRIDGED_MODERN: ("2026-07-28",),
    BRIDGED_PER_SESSION: ("2026-07-28",),
    TYPESCRIPT: HANDSHAKE_ONLY,
    TYPESCRIPT_THROUGH: HANDSHAKE_ONLY,
    TYPESCRIPT_REPLICAS: HANDSHAKE_ONLY,
    TYPESCRIPT_BRIDGED: HANDSHAKE_ONLY,
}
# what each way through toolsearch is compared with: the same server, directly
DIRECT = {TYPESCRIPT_THROUGH: TYPESCRIPT, TYPESCRIPT_REPLICAS: TYPESCRIPT, TYPESCRIPT_BRIDGED: TYPESCRIPT}

# What does not pass through the bridge to a stdio backend of the default protocol, besides. The
# bridge speaks the handshake era to it, so the server asks on the call's stream where a 2026-07-28
# server answers with an input-required result, and the router makes each request a round for the
# 2026-07-28 client (docs/gateway.md). The suite leaves rounds unanswered, and their calls wait for
# the answer in the one process every caller shares; while two calls run in it, the bridge cannot
# tell whose request is whose and refuses it. The calls wait out the backend's `timeout`, set long
# below (`BRIDGED_TIMEOUT`), so that none has ended by the next scenario however slow the machine.
# With `isolation: per_session` each backend session has a process of its own, whose requests are
# its one caller's, offered the capabilities that caller declared: those scenarios pass through
# such a bridge (`BRIDGED_PER_SESSION`, run on them alone, since the suite's anonymous client pays a
# process start for every request it makes), but for two that ask what the handshake era cannot
# say: a server of that era asks one request at a time, under no key of its own, so the router's
# round names it by its place ("0") where the suite wants the key the 2026-07-28 server chose, and
# carries one request where that server put three in one result.
INPUT_REQUIRED = tuple(
    ("2026-07-28", f"input-required-result-{name}")
    for name in (
        "basic-elicitation",
        "basic-sampling",
        "basic-list-roots",
        "request-state",
        "multiple-input-requests",
        "multi-round",
        "non-tool-request",
        "result-type",
        "tampered-state",
        "capability-check",
    )
)
SHARED_STDIO = "a shared stdio process: with two calls in flight, whose request is it? Refused"
BRIDGE_NOT_RELAYED: dict[tuple[str, str], str] = {
    **NOT_RELAYED,
    **dict.fromkeys(INPUT_REQUIRED, SHARED_STDIO),
}
ONLY: dict[str, tuple[tuple[str, str], ...]] = {BRIDGED_PER_SESSION: INPUT_REQUIRED}  # else all
HANDSHAKE_ERA_ASKS = (
    "a handshake-era server asks one request at a time, under no key: a round names it by place"
)
PER_SESSION_NOT_RELAYED: dict[tuple[str, str], str] = {
    **NOT_RELAYED,
    ("2026-07-28", "input-required-result-basic-elicitation"): HANDSHAKE_ERA_ASKS,
    ("2026-07-28", "input-required-result-multiple-input-requests"): HANDSHAKE_ERA_ASKS,
}
BRIDGED_TIMEOUT = 600.0  # seconds a bridged call waits for its client's answers: longer than a run

# The suite's required server scenarios (version 0.2.0-alpha.12), checked against its own list below
SCENARIOS: dict[str, list[str]] = {
    "2025-11-25": [
        "server-initialize",
        "logging-set-level",
        "ping",
        "completion-complete",
        "tools-list",
        "tools-call-simple-text",
        "tools-call-image",
        "tools-call-audio",
        "tools-call-embedded-resource",
        "tools-call-mixed-content",
        "tools-call-with-logging",
        "tools-call-error",
        "tools-call-with-progress",
        "tools-call-sampling",
        "tools-call-elicitation",
        "elicitation-sep1034-defaults",
        "server-sse-multiple-streams",
        "elicitation-sep1330-enums",
        "resources-list",
        "resources-read-text",
        "resources-read-binary",
        "resources-templates-read",
        "resources-subscribe",
        "resources-unsubscribe",
        "prompts-list",
        "prompts-get-simple",
        "prompts-get-with-args",
        "prompts-get-embedded-resource",
        "prompts-get-with-image",
        "dns-rebinding-protection",
    ],
    "2026-07-28": [
        "server-stateless",
        "completion-complete",
        "tools-list",
        "tools-call-simple-text",
        "tools-call-image",
        "tools-call-audio",
        "tools-call-embedded-resource",
        "tools-call-mixed-content",
        "tools-call-error",
        "tools-call-with-progress",
        "server-sse-multiple-streams",
        "resources-list",
        "resources-read-text",
        "resources-read-binary",
        "resources-templates-read",
        "sep-2164-resource-not-found",
        "prompts-list",
        "prompts-get-simple",
        "prompts-get-with-args",
        "prompts-get-embedded-resource",
        "prompts-get-with-image",
        "dns-rebinding-protection",
        "caching",
        *(
            f"input-required-result-{name}"
            for name in (
                "basic-elicitation",
                "basic-sampling",
                "basic-list-roots",
                "request-state",
                "multiple-input-requests",
                "multi-round",
                "missing-input-response",
                "non-tool-request",
                "result-type",
                "unsupported-methods",
                "tampered-state",
                "capability-check",
                "ignore-extra-params",
                "validate-input",
            )
        ),
    ],
}
Results = dict[tuple[str, str], dict[str, Outcome]]  # (target, requirements) -> outcomes


@pytest.fixture(scope="module")
def conformance_server() -> Iterator[str]:
    # the suite's DNS-rebinding scenario wants a localhost URL, which the server allows
    with running_conformance_server("localhost") as url:
        yield url


def _fronting(folder: Path, server: str) -> tuple[Path, dict[str, Any]]:
    """A small catalog in `folder`, and the configuration that adds `server` (over HTTP) beside it,
    pinned whole so that the suite reaches its tools, resources and prompts through the router."""
    catalog = folder / "catalog.jsonl"
    small_catalog(catalog)
    extra = {
        "backends": [{"id": "conf", "url": server.replace("localhost", "127.0.0.1")}],
        "router": {"pinned": ["conf/*"]},
    }
    return catalog, extra


@contextmanager
def _in_front_of(folder: Path, server: str) -> Iterator[Stack]:
    """An indexer and a router as processes, `server` their one backend beside a small catalog."""
    catalog, extra = _fronting(folder, server)
    with running_stack(folder, catalog=catalog, extra=extra) as stack:
        yield stack


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, conformance_server: str) -> Iterator[Stack]:
    with _in_front_of(tmp_path_factory.mktemp("conformance"), conformance_server) as stack:
        yield stack


PYTHON_STDIO = [sys.executable, "-m", "tests.support.conformance_server", "stdio"]


@contextmanager
def _replicas_and_bridge(
    folder: Path, protocol: str, command: list[str] = PYTHON_STDIO, isolation: str = "shared"
) -> Iterator[tuple[str, SplitProxy]]:
    """The server over stdio (`command`) behind the bridge (spoken to in `protocol`, with
    `isolation`), two indexers over Redis, two routers, and a proxy that sends the client's answers
    to the second router; the proxy's MCP URL, and the proxy."""
    catalog = folder / "catalog.jsonl"
    small_catalog(catalog)
    stdio = {
        "id": "conf",
        "command": command[0],
        "args": command[1:],
        "cwd": str(ROOT),
        "protocol": protocol,
        "isolation": isolation,
        "timeout": BRIDGED_TIMEOUT,
    }
    with running_bridge(folder, [stdio]) as bridge:
        extra = {
            "bridge": yaml.safe_load(bridge.config_path.read_text())["bridge"],
            "backends": [stdio],
            "router": {"pinned": ["conf/*"]},  # a loopback router answers to localhost at any port
        }
        with _replicas(folder, catalog, extra, protocol) as target:
            yield target


@contextmanager
def _replicas(
    folder: Path, catalog: Path, extra: dict[str, Any], protocol: str
) -> Iterator[tuple[str, SplitProxy]]:
    """Two indexers over Redis and two routers configured with `extra`, and a proxy that sends the
    client's answers and retries to the second router; the proxy's MCP URL, once a call went all
    the way."""
    with running_redis(folder / "redis") as redis:
        env = {"TOOLSEARCH_INDEXER_STATE": redis.url}
        with running_stack(folder, catalog=catalog, extra=extra, routers=2, replicas=2, env=env) as stack:
            first, second = stack.router_urls
            with split_proxy(first, second, free_port()) as (url, proxy):
                asyncio.run(_first_call(f"{url}/mcp", protocol))
                yield f"{url}/mcp", proxy


async def _first_call(url: str, protocol: str) -> None:
    """A call through every part of the way, as a client of `protocol` would make it: what a way
    does once (a session's version, the connections) is done before the suite runs, whose calls
    some checks give little time."""
    mode = protocol if protocol in MODERN_PROTOCOL_VERSIONS else "legacy"
    async with (
        httpx2.AsyncClient(timeout=60) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        result = await client.call_tool("test_simple_text", {})
    assert not result.is_error, result


@contextmanager
def _replicas_in_front_of(folder: Path, server: str) -> Iterator[tuple[str, SplitProxy]]:
    """`server` over HTTP, as `_in_front_of` has it, behind the replicas."""
    catalog, extra = _fronting(folder, server)
    with _replicas(folder, catalog, extra, "2025-11-25") as target:
        yield target


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, conformance_server: str
) -> Iterator[tuple[str, SplitProxy]]:
    with _replicas_in_front_of(
        tmp_path_factory.mktemp("conformance-http-replicas"), conformance_server
    ) as target:
        yield target


@pytest.fixture(scope="module")
def replicas_and_bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, SplitProxy]]:
    with _replicas_and_bridge(tmp_path_factory.mktemp("conformance-replicas"), "2025-11-25") as target:
        yield target


@pytest.fixture(scope="module")
def replicas_and_modern_bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, SplitProxy]]:
    with _replicas_and_bridge(tmp_path_factory.mktemp("conformance-modern"), "2026-07-28") as target:
        yield target


@pytest.fixture(scope="module")
def replicas_and_per_session_bridge(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, SplitProxy]]:
    folder = tmp_path_factory.mktemp("conformance-per-session")
    with _replicas_and_bridge(folder, "2025-11-25", isolation="per_session") as target:
        yield target


@pytest.fixture(scope="module")
def typescript_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with typescript_conformance_server(tmp_path_factory.mktemp("typescript"), "localhost") as url:
        yield url


@pytest.fixture(scope="module")
def typescript_gateway(tmp_path_factory: pytest.TempPathFactory, typescript_server: str) -> Iterator[Stack]:
    with _in_front_of(tmp_path_factory.mktemp("typescript-gateway"), typescript_server) as stack:
        yield stack


@pytest.fixture(scope="module")
def typescript_replicas(
    tmp_path_factory: pytest.TempPathFactory, typescript_server: str
) -> Iterator[tuple[str, SplitProxy]]:
    with _replicas_in_front_of(tmp_path_factory.mktemp("typescript-replicas"), typescript_server) as target:
        yield target


@pytest.fixture(scope="module")
def typescript_bridged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, SplitProxy]]:
    folder = tmp_path_factory.mktemp("typescript-bridged")
    command = typescript_server_args(folder, "stdio")
    with _replicas_and_bridge(folder, "2025-11-25", command) as target:
        yield target


@pytest.fixture(scope="module")
def targets(
    conformance_server: str,
    gateway: Stack,
    replicas: tuple[str, SplitProxy],
    replicas_and_bridge: tuple[str, SplitProxy],
    replicas_and_modern_bridge: tuple[str, SplitProxy],
    replicas_and_per_session_bridge: tuple[str, SplitProxy],
    typescript_server: str,
    typescript_gateway: Stack,
    typescript_replicas: tuple[str, SplitProxy],
    typescript_bridged: tuple[str, SplitProxy],
) -> dict[str, str]:
    """Every target's MCP URL, by name."""
    return {
        "direct": conformance_server,
        "toolsearch": gateway.mcp_url.replace("127.0.0.1", "localhost"),
        REPLICAS: replicas[0],
        BRIDGED: replicas_and_bridge[0],
        BRIDGED_MODERN: replicas_and_modern_bridge[0],
        BRIDGED_PER_SESSION: replicas_and_per_session_bridge[0],
        TYPESCRIPT: typescript_server,
        TYPESCRIPT_THROUGH: typescript_gateway.mcp_url.replace("127.0.0.1", "localhost"),
        TYPESCRIPT_REPLICAS: typescript_replicas[0],
        TYPESCRIPT_BRIDGED: typescript_bridged[0],
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, targets: dict[str, str]) -> Results:
    """The requirement sets against every target, at once but for the bridges' runs."""

    async def one_by_one(target: str) -> Results:
        # the bridge's stdio server is one shared process, which cannot tell whose log message is
        # whose while two calls run in it at once (docs/gateway.md): its runs go in turn
        url = targets[target]
        if target in ONLY:  # the scenarios alone, one after the other
            alone: Results = {}
            for r, name in ONLY[target]:
                folder = tmp_path_factory.mktemp("scenario")
                alone.setdefault((target, r), {})[name] = await run_scenario(url, name, r, folder)
            return alone
        return {
            (target, r): await run_suite(url, r, tmp_path_factory.mktemp("suite"))
            for r in HELD_TO.get(target, REQUIREMENTS)
        }

    async def all_runs() -> Results:
        for requirements in REQUIREMENTS:  # listed once, before the runs start together
            await server_scenarios(requirements)
        runs = {
            (target, requirements): run_suite(url, requirements, tmp_path_factory.mktemp("suite"))
            for target, url in targets.items()
            if target not in ONE_AT_A_TIME
            for requirements in HELD_TO.get(target, REQUIREMENTS)
        }

        async def bridged() -> Results:
            return {**await one_by_one(BRIDGED), **await one_by_one(TYPESCRIPT_BRIDGED)}

        outcomes, in_turn, per_session = await asyncio.gather(
            asyncio.gather(*runs.values()), bridged(), one_by_one(BRIDGED_PER_SESSION)
        )
        results = dict(zip(runs, outcomes, strict=True))
        results.update(in_turn)
        results.update(per_session)
        # last, alone: server-stateless gives one of its calls 500 ms in all, which the longest way
        # (the proxy, two routers, the bridge, the pipe) must not spend waiting for the other runs
        results.update(await one_by_one(BRIDGED_MODERN))
        results.update(await one_by_one(REPLICAS))  # the proxy and two routers: alone too
        results.update(await one_by_one(TYPESCRIPT_REPLICAS))
        return results

    return asyncio.run(all_runs())


# each way through toolsearch, and what does not pass that way yet
THROUGH: dict[str, dict[tuple[str, str], str]] = {
    "toolsearch": NOT_RELAYED,
    REPLICAS: NOT_RELAYED,
    BRIDGED: BRIDGE_NOT_RELAYED,
    BRIDGED_MODERN: NOT_RELAYED,
    BRIDGED_PER_SESSION: PER_SESSION_NOT_RELAYED,
    TYPESCRIPT_THROUGH: NOT_RELAYED,
    TYPESCRIPT_REPLICAS: NOT_RELAYED,
    TYPESCRIPT_BRIDGED: NOT_RELAYED,
}


def _cases() -> list[object]:
    cases: list[object] = []
    for target, not_relayed in THROUGH.items():
        for requirements, names in SCENARIOS.items():
            if requirements not in HELD_TO.get(target, REQUIREMENTS):
                continue
            for name in names:
                if target in ONLY and (requirements, name) not in ONLY[target]:
                    continue
                reason = not_relayed.get((requirements, name))
                marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
                case_id = f"{target.replace(' ', '-')}-{requirements}-{name}"
                cases.append(pytest.param(target, requirements, name, marks=marks, id=case_id))
    return cases


def test_the_listed_scenarios_are_the_ones_the_suite_requires() -> None:
    listed = {r: asyncio.run(server_scenarios(r)) for r in REQUIREMENTS}
    assert listed == SCENARIOS


@pytest.mark.parametrize("server", ["direct", TYPESCRIPT])
def test_the_conformance_server_passes_every_required_scenario_directly(
    results: Results, server: str
) -> None:
    """The project's server, and the same on the TypeScript SDK (in its own protocol era)."""
    failed = {
        (requirements, name): outcome.failures
        for requirements in HELD_TO.get(server, REQUIREMENTS)
        for name, outcome in results[(server, requirements)].items()
        if not outcome.passed
    }
    assert not failed


@pytest.mark.parametrize(("target", "requirements", "scenario"), _cases())
def test_a_scenario_the_server_passes_directly_passes_through_toolsearch(
    results: Results, target: str, requirements: str, scenario: str
) -> None:
    """Through one router, and through two replicas, Redis and the bridge, the client's answers
    sent to the other replica; to the project's server and to the TypeScript SDK's."""
    direct = results[(DIRECT.get(target, "direct"), requirements)][scenario]
    through = results[(target, requirements)][scenario]
    assert direct.passed, direct.failures
    assert through.passed, through.failures


def test_the_pending_sse_polling_scenario_passes_directly_and_through_toolsearch(
    tmp_path: Path, conformance_server: str, gateway: Stack
) -> None:
    """The suite's `server-sse-polling` (pending in this version, so not in the lists above): the
    server closes a call's stream before its result; directly the suite resumes it, through
    toolsearch the router does, and the result comes on the call's own stream. Both streams open
    with a priming event and say when to resume: no warning through toolsearch."""
    for target, url in (("direct", conformance_server), ("toolsearch", gateway.mcp_url)):
        outcome = asyncio.run(
            run_scenario(
                url.replace("127.0.0.1", "localhost"), "server-sse-polling", "2025-11-25", tmp_path / target
            )
        )
        assert outcome.passed, (target, outcome.failures)
        if target == "toolsearch":
            assert outcome.warnings == (), outcome.warnings


def test_the_clients_answers_went_to_the_other_replica(
    results: Results,
    replicas: tuple[str, SplitProxy],
    replicas_and_bridge: tuple[str, SplitProxy],
    replicas_and_modern_bridge: tuple[str, SplitProxy],
    typescript_replicas: tuple[str, SplitProxy],
) -> None:
    for _, proxy in (replicas, replicas_and_bridge, typescript_replicas):
        assert proxy.answers >= 4  # sampling, elicitation and its two variants, at least: all relayed
    for _, proxy in (replicas, replicas_and_modern_bridge):
        assert proxy.retries >= 10  # a retry of each input-required scenario, at least
