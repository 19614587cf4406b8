"""The report's sections on the model's work: queries batched against one at a time, find_tool with
the model behind an embedding server, and where a cold session open's time goes."""

from __future__ import annotations

from typing import Any

from commands.bench.plan import QUERY_SETS
from commands.bench.tables import rate, row, rule


def batching(results: dict[str, Any]) -> list[str]:
    """find_tool one query a model call against batched, on the same stack with the same queries."""
    found = results["batching"]
    lines = [
        "",
        "## Queries batched against one at a time (ms, p50 / p99, and answers a second)",
        "",
        "The large stack's indexer restarted for each (`indexer.query_batching.enabled`), the same "
        "queries both times; model calls a query and texts a model call from the indexer's Status.",
        "",
        row("queries", "clients", "one at a time", "batched", "model calls a query", "texts a call"),
        rule("l", "r", "r", "r", "r", "r"),
    ]
    for name in QUERY_SETS:
        for clients in ("1", "32"):
            one, batched = found["one_at_a_time"][name][clients], found["batched"][name][clients]
            calls = f"{one['model_calls_per_query']} → {batched['model_calls_per_query']}"
            texts = f"{one['texts_per_model_call']} → {batched['texts_per_model_call']}"
            lines.append(row(name, clients, rate(one), rate(batched), calls, texts))
    lines.append("")
    for name, ratios in found["ratios"].items():
        lines.append(
            f"- {name}: throughput at 32 clients batched / one at a time "
            f"{ratios['throughput_32_batched_over_one_at_a_time']}x; p50 at one client "
            f"{ratios['p50_1_batched_over_one_at_a_time']}x."
        )
    return lines


def embedding_server(results: dict[str, Any]) -> list[str]:
    """find_tool with the indexer embedding through an inference server on the same machine."""
    found = results["server"]
    start = found["indexer_cold_start"]
    lines = [
        "",
        "## find_tool with the model behind an embedding server (ms, p50 / p99, and answers a second)",
        "",
        f"Infinity serving the same model folder on this machine ({found['identity']}; ready in "
        f"{found['server_start_seconds']} s), the indexer embedding through it: the figures are "
        "what the hop costs on one machine, not what a server on hardware of its own gives. The "
        f"indexer's cold start embedded {start['texts_embedded']} texts through it in "
        f"{start['seconds_to_ready']} s; {found['lexical_answers']} answers came from the lexical arm.",
        "",
        row("queries", "clients", "through the server", "model calls a query", "texts a call"),
        rule("l", "r", "r", "r", "r"),
    ]
    for name in QUERY_SETS:
        for clients, run in found["find_tool"][name].items():
            calls, texts = run["model_calls_per_query"], run["texts_per_model_call"]
            lines.append(row(name, clients, rate(run), calls, texts))
    return lines


def cold_open(results: dict[str, Any]) -> list[str]:
    """Where the cold open of the small catalog spends its time: beside the load, alone, the floor."""
    cold = results["session_open"]["cold"]["small"]
    where = cold["where_the_time_goes"]
    during, alone = cold["open_seconds"], where["open_alone_seconds"]
    floor = where["model_floor_seconds"]
    return [
        "",
        f"## Where a cold open's time goes ({cold['tools']} tools, {where['texts_embedded']} texts embedded)",
        "",
        row("", "seconds"),
        rule("l", "r"),
        row("the open beside the steady find_tool load (the target's figure)", during),
        row("the same open with nothing beside it (an indexer restarted on an empty cache)", alone),
        row("the floor: the model's own time for the texts, in this process, nothing beside it", floor),
        row("the whole build in this process (texts, embeddings, BM25, FAISS)", where["build_floor_seconds"]),
        "",
        f"Beside the load the open took {during - alone:+.2f} s more than alone (queries go first); "
        f"alone, {alone - floor:.2f} s more than the model's own time (listing with the caller's token, "
        "the build, the search, the hops).",
    ]
