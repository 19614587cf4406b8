"""The authorization engine alone, in process: visibility over the whole StableToolBench catalog (2,479
tools over 811 servers) under a policy of 100 rules, for one principal cold and cached, for 50
principals, after a policy change; and call-time decisions.

    python -m commands.bench.authorization [--principals 50] [--repeat 5]

The policy is what an organisation writes (`realistic_policy`): teams granted their backends, grants
by a claim, group-wide grants, read-only tools for auditors, a forbid on destructive tools unless an
admin, argument conditions, single tools granted to single callers, conditions on claims, and forbids
for contractors. The catalog's tools carry annotations drawn from a fixed seed (the catalog has none).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from commands.bench.common import STABLETOOLBENCH, machine
from indexer.authorization.authorizer import Authorizer
from indexer.authorization.catalog import Catalog, Item
from indexer.authorization.policies import compile_policy
from indexer.authorization.principal import PolicyPrincipal
from indexer.authorization.source import Source
from toolsearch.catalog import group_by_server, load_catalog
from toolsearch.naming import advertised_names
from toolsearch.sections.authorization_settings import Authorization

SEED = 20240607
TEAMS = 20


def stabletoolbench_catalog(
    seed: int = SEED, path: Path = STABLETOOLBENCH / "tools.jsonl"
) -> tuple[Catalog, dict[str, list[str]]]:
    """Every tool of the catalog (at `path`: the whole of StableToolBench's by default) under the name
    find_tool gives it, with annotations drawn at random; and each backend's advertised tool names."""
    servers = group_by_server(load_catalog(path))
    names = advertised_names({slug: [tool.name for tool in tools] for slug, tools in servers.items()})
    draw = random.Random(seed)
    items: list[Item] = []
    by_backend: dict[str, list[str]] = {}
    for named in names:
        hints = {
            "readOnlyHint": draw.random() < 0.4,
            "destructiveHint": draw.random() < 0.1,
            "idempotentHint": draw.random() < 0.3,
        }
        shown = {hint: value for hint, value in hints.items() if draw.random() < 0.7}  # servers set some
        items.append(Item.tool(named.name, named.backend_id, shown))
        by_backend.setdefault(named.backend_id, []).append(named.name)
    return Catalog(items), by_backend


class _Picks:
    """Backends and tools drawn from a fixed seed."""

    def __init__(self, by_backend: dict[str, list[str]], seed: int) -> None:
        self._draw = random.Random(seed)
        self._by_backend = by_backend
        self._backends = sorted(by_backend)

    def backends(self, count: int) -> str:
        """`count` backends as a list of MCP entities."""
        drawn = self._draw.sample(self._backends, min(count, len(self._backends)))  # a small catalog: all
        return ", ".join(f'MCP::"{backend}"' for backend in drawn)

    def backend(self) -> str:
        return self._draw.choice(self._backends)

    def tool(self) -> str:
        return self._draw.choice(self._by_backend[self.backend()])


def realistic_policy(by_backend: dict[str, list[str]], seed: int = SEED) -> str:
    """100 rules of the kinds an organisation writes, over the catalog's backends and tools."""
    pick = _Picks(by_backend, seed)
    call = 'action == Action::"call_tool"'
    destructive = "resource has destructiveHint && resource.destructiveHint"
    rules = [
        f'@id("team-{k}") permit(principal in THVGroup::"team-{k}", {call}, resource) '
        f"when {{ resource in [{pick.backends(8)}] }};"
        for k in range(TEAMS)
    ]
    rules += [
        f'@id("department-{k}") permit(principal, {call}, resource in MCP::"{pick.backend()}") '
        f'when {{ principal.claim_department == "d{k % 15}" }};'
        for k in range(15)
    ]
    rules += ['@id("admins") permit(principal in THVGroup::"admins", action, resource);']
    rules += ['@id("platform") permit(principal in THVGroup::"platform", action, resource is Tool);']
    rules += [
        f'@id("group-{k}") permit(principal in THVGroup::"group-{k}", action, '
        f'resource in MCP::"{pick.backend()}");'
        for k in range(8)
    ]
    rules += [
        f'@id("auditors-{k}") permit(principal in THVGroup::"auditors-{k}", {call}, resource) '
        "when { resource has readOnlyHint && resource.readOnlyHint };"
        for k in range(5)
    ]
    rules += [
        f'@id("no-destroy-{k}") forbid(principal, {call}, resource) '
        f"when {{ {destructive} && resource in [{pick.backends(40)}] }} "
        'unless { principal in THVGroup::"admins" };'
        for k in range(5)
    ]
    rules += [
        f'@id("support-{k}") permit(principal in THVGroup::"support", {call}, '
        f'resource == Tool::"{pick.tool()}") '
        "when { context has arg_customer && context.arg_customer == principal.claim_customer };"
        for k in range(5)
    ]
    rules += [
        f'@id("limit-{k}") forbid(principal, {call}, resource in MCP::"{pick.backend()}") '
        "when { context has arg_limit && context.arg_limit > 100 };"
        for k in range(5)
    ]
    rules += [
        f'@id("user-{k}") permit(principal == Client::"user-{k}", {call}, resource == Tool::"{pick.tool()}");'
        for k in range(15)
    ]
    rules += [
        f'@id("ops-{k}") permit(principal, {call}, resource) when {{ '
        f'principal.claim_email like "*@ops.example.com" && resource.backend == "{pick.backend()}" }};'
        for k in range(5)
    ]
    rules += [
        f'@id("senior-{k}") permit(principal, {call}, resource in MCP::"{pick.backend()}") '
        f"when {{ principal has claim_level && principal.claim_level >= {3 + k % 3} }};"
        for k in range(5)
    ]
    rules += [
        f'@id("contractors-{k}") forbid(principal in THVGroup::"contractors", action, '
        f'resource in MCP::"{pick.backend()}");'
        for k in range(10)
    ]
    return "\n".join(rules) + "\n"


def caller_claims(count: int, seed: int = SEED) -> list[dict[str, Any]]:
    """The verified claims of callers of different teams, groups and claims: as many allowed sets as
    callers, or nearly."""
    draw = random.Random(seed)
    made = []
    for k in range(count):
        groups = [f"team-{k % TEAMS}", *draw.sample(["support", "auditors-1", "contractors", "group-2"], 2)]
        if k % 25 == 0:
            groups.append("admins")
        made.append(
            {
                "sub": f"user-{k}",
                "groups": groups,
                "department": f"d{k % 15}",
                "email": f"user-{k}@{'ops.' if k % 4 == 0 else ''}example.com",
                "level": k % 6,
                "customer": f"c{k % 7}",
                "exp": 1_900_000_000 + k,
            }
        )
    return made


def principals(settings: Authorization, count: int, seed: int = SEED) -> list[PolicyPrincipal]:
    """`caller_claims` as the policy sees them."""
    return [PolicyPrincipal.of(str(claims["sub"]), claims, settings) for claims in caller_claims(count, seed)]


def _timed(call: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds of one call: on a busy machine the CPU is what the call itself costs."""
    started, cpu = time.perf_counter(), time.thread_time()
    call()
    return time.perf_counter() - started, time.thread_time() - cpu


def _ms(samples: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Median and worst wall time, and median CPU time, in milliseconds."""
    walls, cpus = [wall for wall, _ in samples], [cpu for _, cpu in samples]
    return {
        "p50_ms": round(statistics.median(walls) * 1000, 2),
        "max_ms": round(max(walls) * 1000, 2),
        "cpu_p50_ms": round(statistics.median(cpus) * 1000, 2),
    }


def _every(authorizer: Authorizer, callers: Sequence[PolicyPrincipal], catalog: Catalog) -> None:
    for caller in callers:
        authorizer.visibility(caller, catalog)


def measure(count: int = 50, repeat: int = 5) -> dict[str, Any]:
    """Every figure of the module docstring: medians over `repeat` fresh engines where it matters."""
    catalog, by_backend = stabletoolbench_catalog()
    text = realistic_policy(by_backend)
    edited = text + '@id("one-more") permit(principal, action, resource == Tool::"x");\n'
    settings = Authorization(policies=Path("bench.cedar"))
    callers = principals(settings, count)
    samples: dict[str, list[tuple[float, float]]] = {}
    for _ in range(repeat):
        policy = compile_policy(Source(settings.policies, text), settings)
        authorizer, fresh = Authorizer(policy), Authorizer(policy)
        runs: dict[str, Callable[[], object]] = {
            "compile": partial(compile_policy, Source(settings.policies, text), settings),
            "visibility_cold_first_principal": partial(authorizer.visibility, callers[0], catalog),
            "visibility_cold_principal_catalog_prepared": partial(authorizer.visibility, callers[1], catalog),
            "visibility_cached": partial(authorizer.visibility, callers[0], catalog),
            f"visibility_{count}_principals": partial(_every, fresh, callers, catalog),
        }
        for name, run in runs.items():
            samples.setdefault(name, []).append(_timed(run))
        fresh.replace(compile_policy(Source(settings.policies, edited), settings))
        after = f"visibility_{count}_principals_after_a_policy_change"
        samples.setdefault(after, []).append(_timed(partial(_every, fresh, callers, catalog)))
    authorizer = Authorizer(compile_policy(Source(settings.policies, text), settings))
    seen = [authorizer.visibility(caller, catalog) for caller in callers]
    visible = [len(visibility.visible) for visibility in seen]
    decisions = [
        _timed(partial(authorizer.decide, caller, item, {"limit": 5}))
        for caller in callers[:5]
        for item in catalog.items[:200]
    ]
    return {
        "machine": machine(),
        "catalog": {"tools": len(catalog), "backends": len(by_backend)},
        "policy": {"rules": len(authorizer.policy.rules)},
        "principals": count,
        **{name: _ms(times) for name, times in samples.items()},
        "visible_tools_per_principal": {
            "min": min(visible),
            "median": statistics.median(visible),
            "max": max(visible),
        },
        "distinct_visible_sets": len({visibility.fingerprint for visibility in seen}),
        "call_decision": _ms(decisions),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m commands.bench.authorization", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--principals", type=int, default=50, help="callers asked (default: 50)")
    parser.add_argument("--repeat", type=int, default=5, help="fresh engines measured (default: 5)")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.principals, args.repeat), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
