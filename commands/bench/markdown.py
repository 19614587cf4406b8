"""The Markdown report of a run: the machine, every target with pass or miss, then each part's figures."""

from __future__ import annotations

from typing import Any

from commands.bench.embedding_report import batching, cold_open, embedding_server
from commands.bench.plan import CLIENT_COUNTS, QUERY_SETS
from commands.bench.tables import ms, row, rule
from commands.retrieval.scoring import PEER

CHART = "bench-latency.png"
# find_tool CPU columns: the process names the run measures, and how the table heads them
CPU_COLUMNS = (
    ("router", "router"),
    ("indexer", "indexer"),
    ("bench", "client (SDK)"),
    ("catalog-main", "catalog server"),
    ("other", "other"),
)


def verdict(target: dict[str, Any]) -> str:
    if target["value"] is None:
        return "not measured"
    word = "pass" if target["pass"] else "**miss**"
    if target["margin"] is None:
        return word
    return f"{word} by {abs(target['margin']) * 100:.0f}%"


def header(results: dict[str, Any]) -> list[str]:
    m = results["machine"]
    return [
        f"# toolsearch benchmark ({results['mode']} run)",
        "",
        f"- Machine: {m['cpus']} CPUs, {m['cpu_model']}, {m['memory_gb']} GB memory",
        f"- Software: Python {m['python']}, torch {m.get('torch')}, onnxruntime {m.get('onnxruntime')}, "
        f"{m['platform']}",
        f"- Embedder (indexer.embedder): {results.get('embedder', 'torch')}",
        f"- Load average: {m['load_average']} at the start, {results['load_average_end']} at the end",
        f"- Command: `{results['command']}` ({results['seconds']:.0f} s, {results['date']})",
        "",
        "## Targets",
        "",
        "The embedding server's column: the same figure with the indexer embedding through an",
        "inference server on the same machine (the `server` part), where the run measured it.",
        "",
        row("target", "measured", "limit", "result", "embedding server"),
        rule("l", "r", "r", "l", "r"),
        *(
            row(
                t["target"],
                f"{t['value']} {t['unit']}",
                f"{'≤' if t.get('at_most', True) else '≥'} {t['limit']} {t['unit']}",
                verdict(t),
                server_cell(t),
            )
            for t in results["targets"]
        ),
    ]


def server_cell(target: dict[str, Any]) -> str:
    if target.get("server") is None:
        return ""
    return f"{target['server']} {target['unit']} ({'pass' if target['server_pass'] else 'miss'})"


def find_tool(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## find_tool: latency (ms, p50 / p99) and throughput",
        "",
        "Each request sends its own query, distinct from every other request of the run, so the indexer's",
        "query cache never answers. The floor is measured on its own first, and again beside the single",
        "client (before each of its requests, same query): the target's ratio uses the one beside it.",
        "",
        row(
            "queries", "floor", "floor beside", *(f"{c} client(s)" for c in CLIENT_COUNTS), "1 client / floor"
        ),
        rule("l", "r", "r", *("r" for _ in CLIENT_COUNTS), "r"),
    ]
    for name in QUERY_SETS:
        runs, flo = results["find_tool"][name], results["floor"][name]
        beside = runs["1"].get("beside")
        cells = [f"{ms(runs[str(c)])} ({runs[str(c)]['throughput_per_second']:.0f}/s)" for c in CLIENT_COUNTS]
        label = f"{name} ({flo['texts_per_query']} texts embedded a query)"
        ratio = runs["single_client_p50_over_floor_p50"]
        lines.append(row(label, ms(flo), ms(beside) if beside else "not measured", *cells, ratio))
    lines += ["", "The floor's parts, p50 ms:"]
    for name in QUERY_SETS:
        flo = results["floor"][name]
        lines.append(
            f"- {name}: embedding {flo['embed']['p50_ms']:.1f}, search {flo['search']['p50_ms']:.1f}"
        )
    lines += [
        "",
        "CPU milliseconds per find_tool, by process (`other`: everything else on the machine meanwhile):",
        "",
        row("queries", "clients", *(title for _, title in CPU_COLUMNS), "errors"),
        rule("l", "r", *("r" for _ in CPU_COLUMNS), "r"),
    ]
    for name in QUERY_SETS:
        for clients in CLIENT_COUNTS:
            run = results["find_tool"][name][str(clients)]
            cells = [run["cpu"].get(key, {}).get("ms_per_request", "") for key, _ in CPU_COLUMNS]
            lines.append(row(name, clients, *cells, run["errors"]))
    call = results["call_tool"]
    return [
        *lines,
        "",
        "## call_tool (ms, p50 / p99)",
        "",
        row("path", "latency"),
        rule("l", "r"),
        row(f"through the router ({call['tool']})", ms(call["router"])),
        row(
            "the backend directly, one client session kept open: the backend's own time",
            ms(call["backend_direct"]),
        ),
        row(
            f"the backend directly, a new client per call ({call['backend_protocol']})",
            ms(call["backend_fresh_client"]),
        ),
        *kept_session(results),
    ]


def kept_session(results: dict[str, Any]) -> list[str]:
    """call_tool to a backend that keeps sessions, beside that backend's own time, in the same run."""
    kept = results.get("call_tool_kept_session")
    if not kept:
        return []
    return [
        "",
        f"A backend that keeps sessions ({kept['backend_protocol']}, the initialize handshake): the "
        "router calls it inside the client session's backend session, one request per call.",
        "",
        row("path", "latency"),
        rule("l", "r"),
        row(f"through the router ({kept['tool']})", ms(kept["router"])),
        row("the backend directly, one client session kept open: its own time", ms(kept["backend_direct"])),
        "",
        f"Through the router / the backend's own time, p50: {kept['router_over_backend_p50']}x.",
        *_hop_cpu(kept.get("cpu")),
    ]


def _hop_cpu(cpu: dict[str, Any] | None) -> list[str]:
    """The router's and the indexer's CPU per routed call, when the run measured it."""
    if not cpu:
        return []
    per_call = ", ".join(
        f"{name} {cpu[name]['ms_per_request']} ms" for name in ("router", "indexer") if name in cpu
    )
    return [f"CPU per call through the router: {per_call}."]


def stdio(results: dict[str, Any]) -> list[str]:
    """A stdio server's tool through toolsearch beside the server over stdio; the gateway's start."""
    found = results["stdio"]
    hop, start = found["hop"], found["start"]
    return [
        "",
        "## stdio servers, through the bridge (ms, p50 / p99)",
        "",
        row("path", "latency"),
        rule("l", "r"),
        row("call_tool through the router and the bridge", ms(hop["router"])),
        row("the server over stdio directly, one client session kept open", ms(hop["stdio_direct"])),
        row("call_tool through the router and the bridge speaking 2026-07-28", ms(hop["router_modern"])),
        row("the server over stdio directly in 2026-07-28", ms(hop["stdio_direct_modern"])),
        "",
        f"Through toolsearch / the server's own time over stdio, p50: {hop['router_over_stdio_p50']}x "
        f"(the bridge speaking 2026-07-28 to the server: {hop['modern_router_over_stdio_p50']}x).",
        "",
        f"`toolsearch up` to the stdio tool's first answer through the router: "
        f"{start['seconds_to_first_call']} s alone, {start['seconds_to_first_call_beside_a_stuck_server']} s "
        f"beside a stdio server that never answers initialize ({start['beside_over_alone']}x).",
    ]


def peer(results: dict[str, Any]) -> list[str]:
    """find_tool beside FastMCP's proxy with its BM25 search, the same queries over the same catalog."""
    found = results["peer"]
    lines = [
        "",
        f"## A peer: FastMCP {found['fastmcp']}'s proxy with its BM25 search (ms, p50 / p99)",
        "",
        f"Both in front of the same catalog server ({found['tools']} tools on {found['servers']} servers), "
        "the same queries, toolsearch first and the peer right after. FastMCP's search lists every "
        "server's tools for each query; its CPU is the proxy's and the catalog server's.",
        "",
        row(
            "queries",
            "clients",
            "toolsearch",
            "FastMCP",
            "FastMCP / toolsearch, p50",
            "CPU ms a search (router and indexer / proxy and catalog server)",
            "errors",
        ),
        rule("l", "r", "r", "r", "r", "r", "r"),
    ]
    for name, runs in found["find"].items():
        for clients, run in runs.items():
            ours, theirs = run["toolsearch"], run[PEER]
            mine, peer_cpu = _cpu(ours, ("router", "indexer")), _cpu(theirs, ("peer", "catalog-main"))
            lines.append(
                row(
                    name,
                    clients,
                    f"{ms(ours)} ({ours['throughput_per_second']:.1f}/s)",
                    f"{ms(theirs)} ({theirs['throughput_per_second']:.1f}/s)",
                    run["peer_over_toolsearch_p50"],
                    f"{mine:.1f} / {peer_cpu:.1f}",
                    f"{ours['errors']} / {theirs['errors']}",
                )
            )
    return lines


def second_stage(results: dict[str, Any]) -> list[str]:
    """Part 13: one client with the second stage and without, the same queries."""
    found = results.get("second_stage")
    if not found:
        return []
    lines = [
        "## The second stage: one client, on and off (ms, p50 / p99; CPU ms per find_tool)",
        "",
        "The large catalog's indexer with `indexer.search.second_stage` on, then restarted with it off; "
        "the same queries each time.",
        "",
        row("queries", "on", "off", "p50 on / off", "indexer CPU on / off", "router CPU on / off"),
        rule("l", "r", "r", "r", "r", "r"),
    ]
    for name, runs in found.items():
        on, off = runs["on"], runs["off"]
        indexer = f"{_cpu(on, ('indexer',)):.2f} / {_cpu(off, ('indexer',)):.2f}"
        router = f"{_cpu(on, ('router',)):.2f} / {_cpu(off, ('router',)):.2f}"
        lines.append(row(name, ms(on), ms(off), runs["p50_on_over_off"], indexer, router))
    return [*lines, ""]


def authorization(results: dict[str, Any]) -> list[str]:
    """A policy of 100 rules against none, on one stack: opens, find_tool, call_tool, memory."""
    found = results.get("authorization")
    if not found:
        return []
    memory = found["memory"]
    return [
        f"## Authorization: a policy of {found['policy_rules']} rules over {found['tools']} tools "
        "(ms, p50 / p99)",
        "",
        f"One stack, its indexer without an `authorization` section, then with one; {found['callers']} "
        "callers of different groups and claims (commands/bench/authorized.py).",
        "",
        row("what", "without a policy", "with the policy"),
        rule("l", "r", "r"),
        row("session open (initialize to the first find_tool)", ms(found["session_open_without_policy"]), ""),
        row("  a caller's first under the policy (cold)", "", ms(found["session_open_cold"])),
        row("  the very first (the catalog prepared too)", "", f"{found['session_open_first_caller_ms']}"),
        row("  the same callers again (warm)", "", ms(found["session_open_warm"])),
        row(
            "find_tool, one session",
            ms(found["find_tool_without_policy"]),
            ms(found["find_tool_with_policy"]),
        ),
        row(
            "call_tool, one session",
            ms(found["call_tool_without_policy"]),
            ms(found["call_tool_with_policy"]),
        ),
        "",
        f"Indexer memory (RSS, MB): idle {memory['idle']['rss_mb']}; {memory['one_caller']['sessions']} "
        f"sessions of one caller {memory['one_caller']['rss_mb']} ({memory['one_caller']['versions']} "
        f"version); then as many of {found['callers']} callers {memory['every_caller']['rss_mb']} "
        f"({memory['every_caller']['versions']} scoped versions, +{memory['every_caller_delta_mb']} MB).",
        "",
    ]


def _cpu(run: dict[str, Any], processes: tuple[str, ...]) -> float:
    """CPU milliseconds a request of a load run, summed over some of its processes."""
    return float(sum(run["cpu"].get(name, {}).get("ms_per_request", 0) for name in processes))


def embedders(results: dict[str, Any]) -> list[str]:
    """The floor and find_tool of each embedder, side by side (a run with more than one)."""
    figures = results.get("embedders", {})
    if len(figures) < 2:
        return []
    lines = [
        "",
        "## Embedders side by side: floor and find_tool (ms, p50 / p99)",
        "",
        "The first runs every part; each other one ran the floor and find_tool again with the same "
        "queries, on a stack of its own (its own indexer process and caches).",
        "",
        row("queries", "embedder", "floor", *(f"{c} client(s)" for c in CLIENT_COUNTS), "1 client / floor"),
        rule("l", "l", "r", *("r" for _ in CLIENT_COUNTS), "r"),
    ]
    for name in QUERY_SETS:
        for kind, data in figures.items():
            runs, flo = data.get("find_tool", {}).get(name), data["floor"][name]
            cells = (
                [f"{ms(runs[str(c)])} ({runs[str(c)]['throughput_per_second']:.0f}/s)" for c in CLIENT_COUNTS]
                if runs
                else ["not measured"] * len(CLIENT_COUNTS)
            )
            ratio = runs["single_client_p50_over_floor_p50"] if runs else ""
            lines.append(row(name, kind, ms(flo), *cells, ratio))
    lines += ["", "Cold embedding of the large catalog (empty cache), by embedder:"]
    for kind, data in figures.items():
        cold = data["cold_build"]
        lines.append(f"- {kind} ({data['identity']}): {cold['texts_per_second']} texts/s")
    return lines


def sessions(results: dict[str, Any]) -> list[str]:
    opens = results["session_open"]
    lines = [
        "",
        "## Session open: `initialize` to the first find_tool answer",
        "",
        row(
            "warm (catalog embedded at start-up)", "tools", "p50 / p99 ms", "initialize p50", "find_tool p50"
        ),
        rule("l", "r", "r", "r", "r"),
    ]
    for size in ("small", "large"):
        w = opens["warm"][size]
        lines.append(row(size, w["tools"], ms(w), w["initialize"]["p50_ms"], w["find"]["p50_ms"]))
    lines += [
        "",
        row(
            "cold (first session on a catalog never embedded)",
            "tools",
            "open (s)",
            "steady p99 before → during",
            "next opens p50 ms",
        ),
        rule("l", "r", "r", "r", "r"),
    ]
    for size in ("small", "large"):
        c = opens["cold"][size]
        before, during = c["steady_baseline"], c["steady_during"]
        steady = f"{before['p99_ms']:.1f} → {during['p99_ms']:.1f} ms ({during['count']} requests)"
        lines.append(row(size, c["tools"], c["open_seconds"], steady, c["same_caller_next_opens"]["p50_ms"]))
    lines += [
        "",
        row("indexer process: start to ready", "tools", "seconds", "CPU seconds"),
        rule("l", "r", "r", "r"),
    ]
    for size, start in opens["indexer_cold_start"].items():
        lines.append(
            row(f"empty cache ({size})", start["tools"], start["seconds_to_ready"], start["cpu_seconds"])
        )
    restart = results["embedding"]["process_restart"]
    lines.append(
        row(
            "restart on its filled cache",
            restart["tools"],
            restart["seconds_to_ready"],
            restart["cpu_seconds"],
        )
    )
    return lines


def reindex_memory(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Re-index: a backend's health change to every session on the new version",
        "",
        row("sessions", "change", "to last swap (s)", "versions built", "model calls", "texts embedded"),
        rule("r", "l", "r", "r", "r", "r"),
    ]
    for run in results["reindex"]:
        for f in run["flips"]:
            cells = (f["seconds_to_last_swap"], f["versions_built"], f["model_calls"], f["texts_embedded"])
            lines.append(row(run["sessions"], f["change"], *cells))
    mem = results["memory"]
    lines += ["", "## Indexer memory (MB)", "", row("state", "RSS", "USS"), rule("l", "r", "r")]
    lines.append(row("idle", mem["idle"]["rss_mb"], mem["idle"]["uss_mb"]))
    lines.append(
        row("one session, one find_tool", mem["one_session"]["rss_mb"], mem["one_session"]["uss_mb"])
    )
    total = 0
    for group in mem["groups"]:
        total += group["sessions"]
        lines.append(
            row(
                f"{total} sessions (+{group['sessions']} {group['callers']})",
                group["rss_mb"],
                group["uss_mb"],
            )
        )
    alive = f"{mem['distinct_catalogs']} catalogs, {mem['versions_alive']} versions alive"
    lines.append(
        row(f"all {mem['sessions']} ({alive})", mem["all_sessions"]["rss_mb"], mem["all_sessions"]["uss_mb"])
    )
    cold, restart = results["embedding"]["cold_build"], results["embedding"]["process_restart"]
    bg = results["background"]
    return [
        *lines,
        "",
        "## Embedding",
        "",
        f"- Cold build of {cold['tools']} tools: {cold['build_seconds']} s, "
        f"{cold['tools_per_second']} tools/s; {cold['texts_embedded']} texts in "
        f"{cold['model_calls']} model calls, {cold['texts_per_second']} texts/s.",
        f"- Indexer process restarted on the filled cache: {restart['texts_embedded']} texts embedded, "
        f"{restart['model_calls']} model calls, {restart['cache_hits']} texts from the cache; ready in "
        f"{restart['seconds_to_ready']} s ({restart['tools']} tools).",
        f"- Idle for {bg['wall_seconds']:.0f} s, {bg['backends']} backends probed every "
        f"{results.get('health_probes', {}).get('interval_seconds', '?')} s: "
        f"indexer {bg['indexer']['core_percent']}% of a core, "
        f"catalog server {bg['catalog-main']['core_percent']}%, router {bg['router']['core_percent']}%.",
        *_probe_load(results.get("probe_load")),
    ]


def failures(results: dict[str, Any]) -> list[str]:
    failed = results.get("failures") or []
    if not failed:
        return []
    lines = ["", "## Parts that failed", ""]
    return lines + [f"- {f['part']}: `{f['error']}`" for f in failed]


def markdown(results: dict[str, Any]) -> str:
    """The whole report; a section whose part failed says so instead of its figures."""
    lines = header(results)
    sections = (
        find_tool,
        batching,
        embedding_server,
        embedders,
        second_stage,
        authorization,
        sessions,
        cold_open,
        reindex_memory,
        stdio,
        peer,
    )
    for section in sections:
        try:
            lines += section(results)
        except (KeyError, IndexError, TypeError) as exc:
            lines += ["", f"({section.__name__.replace('_', ' ')}: not measured, missing {exc})"]
    lines += failures(results)
    return "\n".join([*lines, "", f"![find_tool latency against concurrency]({CHART})", ""])


def _probe_load(load: dict[str, Any] | None) -> list[str]:
    """The line on the indexer's CPU with the default health settings, when that part ran."""
    if not load:
        return []
    return [
        f"- Idle for {load['wall_seconds']:.0f} s with the default health settings ({load['backends']} "
        f"backends probed every {load['interval_seconds']:g} s, at most {load['max_concurrent_probes']} "
        f"at once, {load['timeout_seconds']:g} s timeout): indexer {load['indexer']['core_percent']}% of "
        f"a core; {load['backends_advertised_after']} backends advertised after it."
    ]
