"""The indexer process's parts, wired together: `IndexerProcess` builds, starts, reloads and closes them.

`IndexerProcess.build` constructs the parts in the order they depend on each other. The health path
reads the same way: the `HealthMonitor` has the `BackendLister` probe each backend, records each
verdict in the `Registry` and asks the `Rebuilder` for a pass, which runs
`SessionVersions.rebuild_all`; with a shared state the `Replica` publishes the verdicts and the
other replicas' `HealthFollower` adopts them.

Starting and stopping go through an exit stack: each part's close is pushed as it starts, so the
parts close in the reverse order of their start, and a part that fails to start closes every part
started before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx2

from indexer.api.embedding import embeddings_for, served_bands
from indexer.api.finder import Finder
from indexer.authorization.authorizer import Authorizer
from indexer.authorization.policies import load_policy
from indexer.backends.backend_sessions import BackendSessionEnder
from indexer.backends.backend_tokens import BackendTokens
from indexer.backends.follower import HealthFollower
from indexer.backends.lister import BackendLister
from indexer.backends.registry import Registry
from indexer.backends.token_exchange import TokenEndpoints
from indexer.embedder import Embedder
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.index import Builder, VersionPool
from indexer.retrieval.search import SearchSettings
from indexer.retrieval.second_stage import shipped_stage
from indexer.sessions.manager import SessionManager
from indexer.sessions.versions import SessionVersions
from indexer.state import EndedSession, LocalSessions, State, make_state, state_secret
from indexer.upkeep.health import HealthMonitor
from indexer.upkeep.policy_reload import PolicyWatcher
from indexer.upkeep.rebuilds import Rebuilder
from indexer.upkeep.reload import apply_changes, backend_changes
from indexer.upkeep.replica import Replica
from toolsearch.config import Config

logger = logging.getLogger(__name__)


def search_settings(config: Config) -> SearchSettings:
    """The search settings an operator configured, over the tuned defaults."""
    search = config.indexer.search
    overrides = {
        "dense_weight": search.dense_weight,
        "lexical_weight": search.lexical_weight,
        "min_score": search.min_score,
    }
    return dataclasses.replace(SearchSettings(), **{k: v for k, v in overrides.items() if v is not None})


@dataclass
class IndexerProcess:
    """Every long-lived part of one indexer process."""

    config: Config
    embeddings: Embeddings
    registry: Registry
    lister: BackendLister  # every request listing a backend, recording what it learns in the registry
    pool: VersionPool
    sessions: SessionManager
    versions: SessionVersions  # the sessions' versions, rebuilt after changes (built by `sessions`)
    finder: Finder
    transport: httpx2.AsyncHTTPTransport
    rebuilder: Rebuilder
    monitor: HealthMonitor | None = None  # None when health monitoring is switched off
    state: State = field(default_factory=lambda: State(LocalSessions(), None))
    replica: Replica | None = None  # with a shared state: the lease, publishing, events, the sweep
    ender: BackendSessionEnder | None = None  # ends the backend sessions of ended sessions
    policies: PolicyWatcher | None = None  # with an authorization section: the policy file read again
    _reloading: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    _started: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack, repr=False)

    @classmethod
    def build(cls, config: Config, embedder: Embedder, secrets: Mapping[str, str]) -> IndexerProcess:
        settings = search_settings(config)
        section = config.indexer
        # the memory state has no password: one file serves both, its variables then may be unset
        redis = section.state != "memory"
        password_env = section.state_password_env if redis else None
        sentinel_env = section.state_sentinel_password_env if redis else None
        state = make_state(
            section.state,
            embedder.identity,
            embedder.dimension,
            section.cache_dir,
            section.session_ttl,
            section.lease_ttl,
            password=state_secret(secrets, password_env, "indexer.state_password_env"),
            sentinel_password=state_secret(secrets, sentinel_env, "indexer.state_sentinel_password_env"),
            acks=section.state_acks,
        )
        embeddings = embeddings_for(section, embedder, state.embeddings)
        # one pooled transport for every discovery and probe: connections are reused across backends
        transport = httpx2.AsyncHTTPTransport()
        registry = Registry(config.backends)
        # tokens exchanged for token_exchange backends, kept in the state every replica shares
        tokens = BackendTokens(TokenEndpoints(secrets), state.tokens)
        lister = BackendLister(registry, secrets, section.discovery_timeout, transport, tokens)
        builder = Builder(
            embed_documents=embeddings.embed_documents,
            count_tokens=embedder.count_tokens,
            max_tokens=embedder.max_tokens,
            settings=settings,
            separator=section.naming.separator,
        )
        pool = VersionPool(builder)
        shared = state.shared
        # with a shared state, the lease holder's verdicts reach this replica's registry through it
        follower = HealthFollower(shared, registry, state.leadership) if shared is not None else None
        ender = BackendSessionEnder(lister, transport, state.sessions.take_expired)
        sessions = SessionManager(
            lister,
            pool,
            section.naming,
            max_per_principal=section.max_sessions_per_principal,
            store=state.sessions,
            shared=shared,
            follower=follower,
            max_sessions=section.max_sessions,
            ender=ender,
            leadership=state.leadership,
        )
        # the served model's bands: a tuned model's own, calibrated with it (docs/retrieval.md); the
        # second stage shipped for the served model, unless turned off, bands answers with its own
        stage = shipped_stage(embedder.identity) if section.search.second_stage else None
        if section.search.second_stage and stage is None:
            logger.info("no second stage ships for %s: answers are banded by cosine", embedder.identity)
        finder = Finder(embeddings, registry, pool, section.search, served_bands(section, embedder), stage)
        versions = sessions.versions
        rebuilder = Rebuilder(versions)
        watcher = None
        if config.authorization is not None:
            # checked before the process started (commands/authorization.py): a bad file stops it there
            authorizer = Authorizer(load_policy(config.authorization))
            sessions.access.enforce(authorizer)
            # a policy that decides differently rebuilds sessions as a health change does
            watcher = PolicyWatcher(config.authorization, authorizer, rebuilder.request)
        health = section.health
        replica = None
        if shared is not None and follower is not None:
            follow = min(health.interval, 1.0)  # how stale a follower's view of the backends may get
            replica = Replica(
                shared, state.leadership, registry, follower, sessions, versions, rebuilder, follow
            )
        monitor = (
            HealthMonitor(lister, health, rebuilder, replica, state.leadership) if health.enabled else None
        )
        return cls(
            config,
            embeddings,
            registry,
            lister,
            pool,
            sessions,
            versions,
            finder,
            transport,
            rebuilder,
            monitor,
            state,
            replica,
            ender,
            watcher,
        )

    async def start(self) -> None:
        """Discover every backend (failures are left out until they recover), then start probing.

        With a shared state, Redis must answer first (else `StateUnavailable`); then this replica
        takes the lease or adopts its holder's verdicts before it serves. A step that raises closes
        every part started before it, then the error propagates: nothing is left running.
        """
        async with contextlib.AsyncExitStack() as stack:
            # Each close is pushed before its part starts: a part that fails halfway (a lease taken,
            # then Redis gone) is closed too. Unwinding runs them in reverse: the probes stop first,
            # so no verdict reaches a closed part, and the pooled transport, which every discovery
            # and probe borrows, goes last.
            stack.push_async_callback(self.transport.aclose)
            stack.push_async_callback(self.lister.backend_tokens.aclose)
            stack.push_async_callback(self.state.close)
            await self.state.ready()
            logger.info("state: %s", self.state.description)
            stack.callback(self.embeddings.close)
            outage = self.embeddings.outage
            if outage is not None:  # an embedder that can be away: checked while it is
                outage.on_back(self._dense_back)
                stack.push_async_callback(outage.close)
                outage.start()
            # with probes, a backend far slower than the others is found by them: it holds no start
            await self.lister.discover_all(wait_for_all=self.monitor is None)
            for state in self.registry.states.values():
                tools = len(state.listing.tools) if state.listing else 0
                logger.info(
                    "backend %s: %s, %d tools %s",
                    state.config.id,
                    state.status,
                    tools,
                    state.health.last_error,
                )
            if self.ender is not None:
                stack.push_async_callback(self._close_ender, self.ender)
            stack.push_async_callback(self.rebuilder.close)  # a replica taking the lease asks for a pass
            if self.replica is not None:
                stack.push_async_callback(self.replica.close)  # hands the lease on, if join took it
                await self.replica.join()
            # embed every tool before serving, so the first session opens as fast as the next
            await self.sessions.warm()
            if self.ender is not None:
                self.ender.start()
            if self.replica is not None:
                self.replica.start(self.monitor.probe_soon if self.monitor is not None else None)
            if self.monitor is not None:
                stack.push_async_callback(self.monitor.close)
                self.monitor.start()
            if self.policies is not None:
                stack.push_async_callback(self.policies.close)
                await self.policies.check()  # the file as it is now: its bytes are what later reads compare
                self.policies.start()
            self._started = stack.pop_all()  # started: the parts now live until `close`

    async def _dense_back(self) -> None:
        """The embedder is back: the versions built without it get their vectors, sessions move to them."""
        moved = await self.sessions.complete_versions()
        if moved:
            logger.info("embedding back: %d sessions moved to versions with their vectors", moved)

    async def _close_ender(self, ender: BackendSessionEnder) -> None:
        if not self.state.sessions.shared:
            # the sessions die with this process: so do their backend sessions
            for record in await self.sessions.records():
                if record.backend_sessions:
                    ender.end(EndedSession(record.id, record.token, dict(record.backend_sessions)))
        await ender.close()

    async def tools_changed(self, backend_id: str) -> None:
        """A backend said its tools changed: have it probed, and so listed again, soon.

        Alone, this indexer probes it; with replicas, the ask goes to the lease holder through the
        shared state's events. Without health probes, the tools are listed at start and on reload.
        """
        if self.replica is not None:
            await self.replica.tools_changed(backend_id)
        elif self.monitor is not None:
            self.monitor.probe_soon(backend_id)

    async def reload(self, config: Config) -> None:
        """Apply a reread configuration's backend list; other settings need a restart."""
        async with self._reloading:
            changes = backend_changes(self.config.backends, config.backends)
            if config.model_copy(update={"backends": self.config.backends}) != self.config:
                logger.warning("config reload: only the backend list changes without a restart")
            await apply_changes(changes, self.lister, self.versions, self.monitor, self.rebuilder)
            self.config = self.config.model_copy(update={"backends": config.backends})
            if self.replica is not None:
                await self.replica.publish(force=True)

    async def close(self) -> None:
        """Close what `start` started, in the reverse order; a second call closes nothing."""
        await self._started.aclose()
