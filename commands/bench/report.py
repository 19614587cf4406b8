"""The run's results: every target judged, then results.json, results.md and the latency chart."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from commands.bench.markdown import CHART, markdown
from commands.bench.plan import CLIENT_COUNTS, QUERY_SETS

# find_tool requests a second at 32 clients: StableToolBench's queries are task instructions of a
# few sentences (several texts embedded each), MetaTool's one line
THROUGHPUT = {"stabletoolbench": 60.0, "metatool": 150.0}


def _target(
    name: str,
    value: float | None,
    limit: float,
    unit: str,
    at_most: bool = True,
    server: float | None = None,
) -> dict[str, Any]:
    """One target: the figure, its limit, pass or miss, and by how much (as a share of the limit).

    `server`: the same figure with the indexer embedding through an inference server, where the
    run measured it (the embedding server's column; judged by the same limit, not part of the verdict).
    """
    extra = (
        {} if server is None else {"server": round(server, 3), "server_pass": _passes(server, limit, at_most)}
    )
    if value is None:
        return {
            "target": name,
            "value": None,
            "limit": limit,
            "unit": unit,
            "pass": False,
            "margin": None,
            **extra,
        }
    ok = _passes(value, limit, at_most)
    margin = None
    if limit:  # a limit of zero is met or missed, not by a share of itself
        margin = (limit - value) / limit if at_most else (value - limit) / limit
    return {
        "target": name,
        "value": round(value, 3),
        "limit": limit,
        "unit": unit,
        "at_most": at_most,
        "pass": ok,
        "margin": None if margin is None else round(margin, 3),
        **extra,
    }


def _passes(value: float, limit: float, at_most: bool) -> bool:
    return value <= limit if at_most else value >= limit


def _get(results: dict[str, Any], *path: str | int) -> Any:
    """A figure by its path in the results, or None when its part did not produce it."""
    value: Any = results
    for key in path:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def _find_tool_targets(results: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """find_tool's targets for one query set, with the embedding server's column where it ran."""

    def get(*path: str | int) -> Any:
        return _get(results, *path)

    out = []
    ratio = get("find_tool", name, "single_client_p50_over_floor_p50")
    served = get("server", "find_tool", name)  # the same runs with the model behind a server
    server_p50 = _get(served, "1", "p50_ms")
    floor_p50 = get("floor", name, "p50_ms")
    server_ratio = server_p50 / floor_p50 if server_p50 is not None and floor_p50 else None
    out.append(_target(f"find_tool p50, 1 client / floor p50 ({name})", ratio, 1.5, "x", server=server_ratio))
    rate = get("find_tool", name, "32", "throughput_per_second")
    limit = THROUGHPUT[name]
    out.append(
        _target(
            f"find_tool throughput, 32 clients ({name})",
            rate,
            limit,
            "/s",
            at_most=False,
            server=_get(served, "32", "throughput_per_second"),
        )
    )
    out.append(
        _target(
            f"find_tool p99, 32 clients ({name})",
            get("find_tool", name, "32", "p99_ms"),
            150,
            "ms",
            server=_get(served, "32", "p99_ms"),
        )
    )
    router_cpu = get("find_tool", name, "32", "cpu", "router", "ms_per_request")
    out.append(_target(f"router CPU per find_tool, 32 clients ({name})", router_cpu, 2.0, "ms"))
    indexer_cpu = get("find_tool", name, "32", "cpu", "indexer", "ms_per_request")
    model_cpu = get("floor", name, "model_cpu_ms_per_query")
    share = indexer_cpu / model_cpu if indexer_cpu is not None and model_cpu else None
    out.append(
        _target(f"indexer CPU per find_tool, 32 clients / the model's own CPU ({name})", share, 1.2, "x")
    )
    return out


def _second_stage_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What the second stage costs one client: p50 and the indexer's CPU per find_tool, on over off."""
    out = []
    for name in QUERY_SETS:
        ratio = _get(results, "second_stage", name, "p50_on_over_off")
        out.append(_target(f"find_tool p50, 1 client, second stage on / off ({name})", ratio, 1.5, "x"))
        ratio = _get(results, "second_stage", name, "indexer_cpu_on_over_off")
        out.append(
            _target(f"indexer CPU per find_tool, 1 client, second stage on / off ({name})", ratio, 1.5, "x")
        )
    return out


def _authorization_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What a policy of 100 rules costs over the large catalog, against the same stack without one."""
    found = results.get("authorization") or {}
    tools, callers = found.get("tools"), found.get("callers")
    warm = _get(results, "authorization", "session_open_warm", "p50_ms")
    memory = _get(results, "authorization", "memory", "every_caller_delta_mb")
    return [
        _target(
            f"find_tool p50 with a policy of 100 rules / without, {tools} tools",
            found.get("find_tool_p50_ratio"),
            1.2,
            "x",
        ),
        _target("call_tool p50 with the policy / without", found.get("call_tool_p50_ratio"), 1.2, "x"),
        _target(f"session open warm with the policy, {tools} tools, p50", warm, 50, "ms"),
        _target(
            f"indexer RSS: {callers} callers' sessions of different allowed sets above one caller's",
            memory,
            50,
            "MB",
        ),
    ]


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets, each judged on what this run measured (None where a part failed)."""

    def get(*path: str | int) -> Any:
        return _get(results, *path)

    out = []
    for name in QUERY_SETS:
        out += _find_tool_targets(results, name)
    out += _second_stage_targets(results)
    out += _authorization_targets(results)
    large = get("session_open", "warm", "large", "tools")
    out.append(
        _target(
            f"session open warm, {large} tools, p50", get("session_open", "warm", "large", "p50_ms"), 50, "ms"
        )
    )
    small = get("session_open", "cold", "small", "tools")
    cold = get("session_open", "cold", "small", "open_seconds")
    out.append(_target(f"session open cold, {small} tools", cold, 1.2, "s"))
    ratio = get("session_open", "cold", "small", "steady_p99_ratio")
    out.append(_target("other sessions' p99 during that cold open / their baseline p99", ratio, 1.5, "x"))
    runs = get("reindex") or []
    biggest = max(runs, key=lambda r: r["sessions"]) if runs else {}
    seconds = _get(biggest, "flips", 0, "seconds_to_last_swap")
    out.append(_target(f"re-index, {biggest.get('sessions')} sessions", seconds, 1.0, "s"))
    calls = sum(flip["model_calls"] for run in runs for flip in run["flips"]) if runs else None
    out.append(_target("embedding calls during re-index", calls, 0, "calls"))
    sessions = get("memory", "sessions")
    delta = get("memory", "delta_rss_mb")
    out.append(_target(f"indexer RSS above idle, {sessions} sessions, 3 catalogs", delta, 300, "MB"))
    texts = get("embedding", "process_restart", "texts_embedded")
    out.append(_target("texts embedded by a restart on a filled cache", texts, 0, "texts"))
    kept = get("call_tool_kept_session", "router_over_backend_p50")
    out.append(_target("call_tool p50 through the router / the backend's own, kept session", kept, 1.5, "x"))
    hop = get("stdio", "hop", "router_over_stdio_p50")
    out.append(
        _target(
            "a stdio tool's call_tool p50 through toolsearch / the server's own over stdio", hop, 2.0, "x"
        )
    )
    modern = get("stdio", "hop", "modern_router_over_stdio_p50")
    out.append(_target("the same, the bridge speaking 2026-07-28 to the server", modern, 2.0, "x"))
    start = get("stdio", "start", "beside_over_alone")
    out.append(_target("gateway start beside a stdio server that never answers / alone", start, 1.2, "x"))
    if results.get("mode") != "quick":  # a quick run leaves the first run out
        seconds = get("first_run", "seconds_to_up")
        out.append(_target('`make run` from a clean clone to "toolsearch is up"', seconds, 120, "s"))
        out.append(_target("its virtualenv", get("first_run", "venv_mb"), 600, "MB"))
    return out


def chart(results: dict[str, Any], path: Path) -> None:
    """find_tool p50 and p99 against concurrent clients, the floor drawn in, and the throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, color in zip(QUERY_SETS, ("tab:blue", "tab:orange"), strict=True):
        runs, flo = results["find_tool"][name], results["floor"][name]
        left.plot(
            CLIENT_COUNTS,
            [runs[str(c)]["p50_ms"] for c in CLIENT_COUNTS],
            "o-",
            color=color,
            label=f"{name} p50",
        )
        left.plot(
            CLIENT_COUNTS,
            [runs[str(c)]["p99_ms"] for c in CLIENT_COUNTS],
            "s--",
            color=color,
            label=f"{name} p99",
        )
        # the floor measured beside the single client when the run has it, else the one before
        beside = runs["1"].get("beside", flo)
        left.axhline(beside["p50_ms"], color=color, linestyle=":", label=f"{name} floor p50")
        right.plot(
            CLIENT_COUNTS,
            [runs[str(c)]["throughput_per_second"] for c in CLIENT_COUNTS],
            "o-",
            color=color,
            label=name,
        )
    left.axhline(150, color="grey", linewidth=0.8, label="p99 target (32 clients)")
    right.axhline(200, color="grey", linewidth=0.8, label="target (32 clients)")
    for axis, label in ((left, "latency (ms)"), (right, "find_tool per second")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(CLIENT_COUNTS, [str(c) for c in CLIENT_COUNTS])
        axis.set_xlabel("concurrent clients (one session each)")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    left.set_yscale("log")
    left.set_title("find_tool through the router")
    right.set_title("throughput")
    fig.suptitle(
        f"{results['machine']['cpus']} CPUs, {results['catalogs']['large']} tools ({results['mode']} run)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: dict[str, Any], folder: Path) -> dict[str, Path]:
    """results.json, results.md and the chart in `folder`; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"json": folder / "results.json", "markdown": folder / "results.md", "chart": folder / CHART}
    # the measurements first, so a failure in what follows never loses a run
    paths["json"].write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    results["targets"] = targets(results)
    paths["json"].write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown(results), encoding="utf-8")
    with contextlib.suppress(KeyError, TypeError):  # no chart when find_tool was not measured
        chart(results, paths["chart"])
    return paths
