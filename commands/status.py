"""`toolsearch status`: the indexer's backends, sessions and index versions, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import grpc
from google.protobuf.json_format import MessageToDict

from commands.options import add_config
from toolsearch.config import load_config
from toolsearch.transport import ChannelSecurity, TransportConfigError, channel_security, sync_channel
from toolsearch.v1 import indexer_pb2 as pb
from toolsearch.v1 import indexer_pb2_grpc as pb_grpc


def fetch(address: str, timeout: float, security: ChannelSecurity | None = None) -> pb.StatusResponse:
    """The indexer's Status answer; `security` carries the link's TLS credentials and shared secret."""
    metadata = security.metadata if security is not None else ()
    with sync_channel(address, security) as channel:
        stub = pb_grpc.IndexerStub(channel)
        return stub.Status(pb.StatusRequest(), timeout=timeout, metadata=metadata or None)  # type: ignore[no-any-return]


def render(status: pb.StatusResponse) -> str:
    """A plain-text report of a Status answer."""
    counters = status.embedding
    lines = [
        f"model: {status.model}",
        f"embedding: {counters.texts_embedded} texts in {counters.model_calls} model calls, "
        f"{counters.cache_hits} from the cache",
        *(
            [f"embedding UNAVAILABLE: {counters.unavailable_reason}; find_tool answers from the lexical arm"]
            if counters.unavailable
            else []
        ),
        "",
        "backends:",
    ]
    for b in status.backends:
        extra = f"  ({b.last_error})" if b.last_error else ""
        circuit = f" circuit={b.circuit}" if b.circuit else ""
        lines.append(
            f"  {b.id:<32} {b.status:<15} {b.tool_count:>5} tools {b.latency_ms:>8.1f} ms{circuit}{extra}"
        )
    lines += ["", f"index versions: {len(status.versions)}"]
    for v in status.versions:
        lines.append(f"  {v.fingerprint}  {v.tool_count:>5} tools  {v.sessions:>6} sessions")
    lines += ["", f"sessions: {len(status.sessions)}"]
    for s in status.sessions:
        who = f"{s.principal.issuer} {s.principal.subject}".strip() or "anonymous"
        rejected = f" rejected={','.join(s.rejected_backends)}" if s.rejected_backends else ""
        lines.append(f"  {s.session_id}…  {who}  v{s.version.number} {s.version.fingerprint[:12]}{rejected}")
        for swap in s.swaps:
            when = time.strftime("%H:%M:%S", time.localtime(swap.at_unix))
            lines.append(
                f"      {when} v{swap.current.number} {swap.current.fingerprint[:12]}  {swap.reason}"
            )
    return "\n".join(lines)


def run_cli(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config), os.environ)
    address = args.indexer or config.router.indexer[0]
    try:
        security = channel_security(config.router, os.environ)
    except TransportConfigError as exc:
        print(f"toolsearch status: {exc}", file=sys.stderr)
        return 2
    try:
        status = fetch(address, args.timeout, security)
    except grpc.RpcError as exc:
        print(
            f"toolsearch status: the indexer at {address} did not answer: {exc.code().name}", file=sys.stderr
        )
        return 1
    if args.json:
        print(json.dumps(MessageToDict(status, preserving_proto_field_name=True), indent=2))
    else:
        print(render(status))
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("status", help="print the indexer's backends, sessions and versions")
    add_config(parser)
    parser.add_argument("--indexer", help="the indexer address (default: the config's first)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.set_defaults(func=run_cli)
