"""Index versions: immutable, content-addressed, shared by every session with the same tool set.

A version is built once per distinct tool set (its fingerprint) and never changes afterwards, so a
request that read a session's current version can use it to the end while a newer one is swapped
in. The pool hands out one instance per fingerprint and forgets it when no session holds it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

import numpy as np

from indexer.embedder.base import EmbedderUnavailable
from indexer.retrieval.documents import ServerDocument, ToolDocument, server_documents, tool_documents
from indexer.retrieval.query import Query
from indexer.retrieval.search import Hit, Method, SearchIndex, SearchSettings, index_documents
from indexer.retrieval.tools import Tool
from indexer.state.listings import ServerInfo

logger = logging.getLogger(__name__)

Servers = Mapping[str, ServerInfo]  # backend id -> what the server said of itself (only those that did)


def servers_of(tools: Sequence[Tool]) -> dict[str, ServerInfo]:
    """What each backend's server said of itself, as its tools carry it (only those that said anything)."""
    return {tool.backend_id: tool.server for tool in tools if tool.server}


def fingerprint(tools: Sequence[Tool]) -> str:
    """A hash of a tool set: the same tools under the same names give the same fingerprint.

    The backend's own name is part of it: an advertised `a_x` may be backend a's `x`, prefixed on a
    collision, or its `a_x`, and the two must not share a version (calls go by the original name).
    What servers say of themselves (as the tools carry it) is part of it when they said anything:
    it is in the index (their server documents) and in the answers.
    """
    digest = hashlib.sha256()
    for tool in sorted(tools, key=lambda t: t.name):
        for part in (tool.backend_id, tool.original_name, tool.definition_json):
            digest.update(part.encode())
            digest.update(b"\0")
    for backend_id, info in sorted(servers_of(tools).items()):
        for part in (backend_id, *info.as_dict().values()):
            digest.update(b"\1" + part.encode())
    return digest.hexdigest()[:32]


@dataclass(frozen=True, eq=False)
class IndexVersion:
    """One built index over one tool set. Immutable after construction."""

    fingerprint: str
    tools: tuple[Tool, ...]
    by_name: dict[str, Tool] = field(repr=False)
    search_index: SearchIndex | None = field(repr=False)  # None for an empty tool set
    baseline_tokens: int
    backends: frozenset[str]
    # what each tool brought, held so that the builder's memo keeps it while this version lives
    documents: tuple[ToolDocument, ...] = field(default=(), repr=False)
    servers: Servers = field(default_factory=dict, repr=False)  # what servers said of themselves
    server_documents: tuple[ServerDocument, ...] = field(default=(), repr=False)
    # False for a version built while the embedder was away: the lexical arm alone answers from it,
    # until the pool builds it again with its vectors (`VersionPool.complete`)
    dense: bool = True

    @property
    def dimension(self) -> int:
        """The length of its tools' vectors (0 for an empty tool set)."""
        return int(self.documents[0].vectors.shape[1]) if self.documents else 0

    def server(self, backend_id: str) -> ServerInfo:
        """What a backend's server said of itself (empty when nothing)."""
        return self.servers.get(backend_id) or ServerInfo()

    def find(self, query: Query, limit: int, method: Method = "hybrid") -> list[tuple[Tool, float]]:
        """The best `limit` tools for a query, best first."""
        if self.search_index is None:
            return []
        hits: list[Hit] = self.search_index.search(query, limit, method)
        return [(self.tools[hit.position], hit.score) for hit in hits]

    def find_hits(self, query: Query, limit: int, method: Method = "hybrid") -> list[tuple[Tool, Hit]]:
        """The best `limit` tools for a query with their hits (score and match), best first."""
        if self.search_index is None:
            return []
        hits = self.search_index.search(query, limit, method)
        return [(self.tools[hit.position], hit) for hit in hits]

    def resolve(self, name: str) -> Tool | None:
        """The tool advertised under `name`, if this version holds it."""
        return self.by_name.get(name)

    @cached_property
    def positions(self) -> dict[str, int]:
        """Each tool's place in `tools` (and in the search index), by advertised name."""
        return {tool.name: position for position, tool in enumerate(self.tools)}

    def position(self, name: str) -> int:
        return self.positions[name]


def _aliases(tool: Tool, separator: str) -> list[str]:
    """Other exact names a query may use for a tool: its own name and its prefixed form."""
    names = {tool.original_name, f"{tool.backend_id}{separator}{tool.original_name}"}
    names.discard(tool.name)
    return sorted(names)


DocumentKey = tuple[str, str, str]  # backend, the backend's own name, the advertised definition (JSON)


def document_key(tool: Tool) -> DocumentKey:
    """What a tool's document is derived from, as content: its backend and its definition.

    The advertised JSON holds the whole definition but the backend's own name, which the text uses.
    """
    return (tool.backend_id, tool.original_name, tool.definition_json)


class Documents:
    """Tool documents by content, for as long as some version holds them.

    A health change moves sessions to a version over tools the current one already holds, so the
    memo needs nothing else, and bounds itself: an entry goes with the last version that used it.
    """

    def __init__(self) -> None:
        self._known: weakref.WeakValueDictionary[DocumentKey, ToolDocument] = weakref.WeakValueDictionary()
        self._servers: weakref.WeakValueDictionary[tuple[object, ...], ServerDocument] = (
            weakref.WeakValueDictionary()
        )
        self._lock = threading.Lock()  # versions are built in worker threads, several at once
        self.derived = 0  # tools whose document was derived rather than found

    def __len__(self) -> int:
        return len(self._known)

    def of(self, tools: Sequence[Tool], builder: Builder) -> list[ToolDocument]:
        """The documents of `tools`, in order: the ones known reused, the others derived together."""
        keys = [document_key(tool) for tool in tools]
        with self._lock:
            found = [self._known.get(key) for key in keys]
        missing = [position for position, document in enumerate(found) if document is None]
        if missing:
            fresh = tool_documents(
                [tools[p].definition for p in missing],
                [tools[p].backend_id for p in missing],
                builder.embed_documents,
                builder.count_tokens,
                builder.max_tokens,
            )
            with self._lock:
                self.derived += len(missing)
                for position, document in zip(missing, fresh, strict=True):
                    # another build may have derived the same tool meanwhile: share the first
                    found[position] = self._known.setdefault(keys[position], document)
        return cast("list[ToolDocument]", found)  # every gap was filled above

    def servers(self, tools: Sequence[Tool], servers: Servers, builder: Builder) -> list[ServerDocument]:
        """The server documents of `tools`' backends; a backend whose tools and info are known is reused.

        A health change drops or adds whole backends, so most servers of a rebuild are known already.
        """
        grouped: dict[str, list[Tool]] = {}
        for tool in tools:
            grouped.setdefault(tool.backend_id, []).append(tool)
        out: list[ServerDocument] = []
        for backend_id, members in sorted(grouped.items()):
            info = servers.get(backend_id) or ServerInfo()
            key = (backend_id, info.about, *(document_key(t)[1:] for t in members))
            with self._lock:
                known = self._servers.get(key)
            if known is None:
                (known,) = server_documents(
                    [t.definition for t in members],
                    [backend_id] * len(members),
                    builder.embed_documents,
                    {backend_id: info.about},
                    builder.count_tokens,
                    builder.max_tokens,
                )
                with self._lock:
                    known = self._servers.setdefault(key, known)
            out.append(known)
        return out


@dataclass(frozen=True)
class Builder:
    """What building a version needs: the embedder's document path, the search settings, and the memo.

    `documents` remembers what each tool of a live version brought, so a version over tools seen
    before (a health change, a recovery) only concatenates them and builds FAISS and BM25.
    """

    embed_documents: Callable[[Sequence[str]], np.ndarray]
    count_tokens: Callable[[str], int]
    max_tokens: int
    settings: SearchSettings
    separator: str = "_"
    documents: Documents = field(default_factory=Documents, compare=False, repr=False)


LEXICAL_DIMENSION = 1  # a lexical version's placeholder vectors: one zero row per tool view


def _no_vectors(texts: Sequence[str]) -> np.ndarray:
    return np.zeros((len(texts), LEXICAL_DIMENSION), dtype=np.float32)


def build_version(tools: Sequence[Tool], builder: Builder, lexical: bool = False) -> IndexVersion:
    """Build a version (blocking: derives and embeds what no live version holds, builds both indexes).

    What the backends' servers said of themselves (each tool carries it) goes into their server
    documents and the answers. `lexical`: for when the embedder is away, a version of the tools'
    terms alone, with zero placeholder vectors (`dense` False), none of it memoised.
    """
    ordered = tuple(sorted(tools, key=lambda t: t.name))
    servers = servers_of(ordered)
    search_index = None
    documents: tuple[ToolDocument, ...] = ()
    units: tuple[ServerDocument, ...] = ()
    if ordered and lexical:
        documents = tuple(
            tool_documents(
                [tool.definition for tool in ordered],
                [tool.backend_id for tool in ordered],
                _no_vectors,
                builder.count_tokens,
                builder.max_tokens,
            )
        )
    elif ordered:
        documents = tuple(builder.documents.of(ordered, builder))
        backends = [tool.backend_id for tool in ordered]
        if builder.settings.server_weight and builder.settings.backend_weight and len(set(backends)) > 1:
            units = tuple(builder.documents.servers(ordered, servers, builder))
    if ordered:
        search_index = index_documents(
            documents,
            names=[tool.name for tool in ordered],
            aliases=[_aliases(tool, builder.separator) for tool in ordered],
            settings=builder.settings,
            backends=[tool.backend_id for tool in ordered],
            servers=units or None,
        )
    return IndexVersion(
        fingerprint=fingerprint(ordered),
        tools=ordered,
        by_name={tool.name: tool for tool in ordered},
        search_index=search_index,
        baseline_tokens=sum(tool.tokens for tool in ordered),
        backends=frozenset(tool.backend_id for tool in ordered),
        documents=documents,
        servers=servers,
        server_documents=units,
        dense=not lexical,
    )


class VersionPool:
    """Built versions by fingerprint; one build per fingerprint, however many ask at once."""

    def __init__(self, builder: Builder) -> None:
        self._builder = builder
        # Weak values: a version lives exactly as long as a session (or a request) holds it.
        self._versions: weakref.WeakValueDictionary[str, IndexVersion] = weakref.WeakValueDictionary()
        self._building: dict[str, asyncio.Future[IndexVersion]] = {}
        self.builds = 0

    def __len__(self) -> int:
        return len(self._versions)

    def versions(self) -> list[IndexVersion]:
        """The versions alive now."""
        return list(self._versions.values())

    def lookup(self, key: str) -> IndexVersion | None:
        return self._versions.get(key)

    async def get(self, tools: Sequence[Tool], key: str | None = None) -> IndexVersion:
        """The version for a tool set whose fingerprint is `key` (if known): shared, or built off the loop."""
        key = key or fingerprint(tools)
        existing = self._versions.get(key)
        if existing is not None:
            return existing
        pending = self._building.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[IndexVersion] = asyncio.get_running_loop().create_future()
        self._building[key] = future
        try:
            try:
                version = await asyncio.to_thread(build_version, tools, self._builder)
            except EmbedderUnavailable as exc:
                # the embedder is away: the lexical arm answers from this until `complete`
                logger.info("index of %d tools built for the lexical arm alone: %s", len(tools), exc)
                version = await asyncio.to_thread(build_version, tools, self._builder, True)
            self.builds += 1
            self._versions[key] = version
            future.set_result(version)
            return version
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._building[key]

    async def complete(self) -> list[tuple[IndexVersion, IndexVersion]]:
        """Build again, with their vectors, the versions built while the embedder was away.

        Each keeps its fingerprint (the same tools): the pool hands out the new one from now on, and
        the (old, new) pairs returned say which sessions to move. Stops at the first build the
        embedder cannot serve; the next outage's end runs it again.
        """
        done: list[tuple[IndexVersion, IndexVersion]] = []
        for key, old in list(self._versions.items()):
            if old.dense:
                continue
            try:
                new = await asyncio.to_thread(build_version, old.tools, self._builder)
            except EmbedderUnavailable:
                break
            self.builds += 1
            if self._versions.get(key) is old:
                self._versions[key] = new
            done.append((old, new))
        return done
