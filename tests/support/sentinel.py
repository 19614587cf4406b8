"""Redis with Sentinel for tests: a primary, replicas and three sentinels, real processes on loopback.

    with running_sentinels(tmp_path, replicas=2) as group:
        url = group.url  # redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/toolsearch/0
        group.kill_primary()  # SIGKILL, as a node lost
        new = group.wait_for_promotion(within=30)

Sentinels run as `redis-server --sentinel` with the timing of the Kubernetes manifests
(deploy/kubernetes: `down-after-milliseconds` 5000, `failover-timeout` 60000), so the failover the
tests measure is the one a deployment gets. Skipped when redis-server is not installed.
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from commands.ports import free_port
from tests.support.processes import Proc, start_process
from tests.support.redis import START_TIMEOUT, redis_answers
from tests.support.stack import wait_until

SERVICE = "toolsearch"
DOWN_AFTER_MS = 5000  # as deploy/kubernetes/components/redis-sentinel/sentinel.conf
FAILOVER_TIMEOUT_MS = 60000
QUORUM = 2


def _binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/ensure-redis installs it)")
    return binary


def server_args(port: int, folder: Path, password: str | None, primary: int | None) -> list[str]:
    """A data node: no persistence (replication is what keeps the data), optionally a replica."""
    args = [_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", str(folder)]
    if password:
        args += ["--requirepass", password, "--masterauth", password]
    if primary is not None:
        args += ["--replicaof", "127.0.0.1", str(primary)]
    return args


def sentinel_config(port: int, folder: Path, primary: int, password: str | None, quorum: int) -> Path:
    """A sentinel's file: sentinels rewrite it with what they learn, so each gets its own."""
    lines = [
        f"port {port}",
        "bind 127.0.0.1",
        f"dir {folder}",
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary} {quorum}",
        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
        f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {SERVICE} 1",
    ]
    if password:
        lines.append(f"sentinel auth-pass {SERVICE} {password}")
    path = folder / f"sentinel-{port}.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def node(port: int, password: str | None = None) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=port, password=password, socket_timeout=2, socket_connect_timeout=2
    )


def replicating(port: int, password: str | None) -> bool:
    """Whether the replica on `port` has its link to the primary up."""
    try:
        info = node(port, password).info("replication")
    except (redis.RedisError, OSError):
        return False
    return bool(info.get("master_link_status") == "up")


@dataclass
class SentinelGroup:
    """A primary, its replicas and the sentinels watching them; `procs` by port."""

    folder: Path
    password: str | None
    primary: int
    replicas: list[int]
    sentinels: list[int] = field(default_factory=list)
    procs: dict[int, Proc] = field(default_factory=dict)
    frozen: list[Proc] = field(default_factory=list)  # stopped with SIGSTOP: killed at the end

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def master_seen_by(self, sentinel: int) -> int | None:
        try:
            answer = node(sentinel).sentinel_get_master_addr_by_name(SERVICE)
        except (redis.RedisError, OSError):
            return None
        return int(answer[1]) if answer else None

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.popen.kill()  # as a lost node: no shutdown, no last save, no goodbye to the replicas
        proc.stop()

    def replicated(self) -> bool:
        """Whether every replica has acknowledged everything the primary has written."""
        info = node(self.primary, self.password).info("replication")
        offset = int(info["master_repl_offset"])
        replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return len(replicas) == len(self.replicas) and all(int(r["offset"]) >= offset for r in replicas)

    def kill_primary(self) -> int:
        """SIGKILL the primary; returns its port."""
        dead = self.primary
        self.kill(dead)
        return dead

    def freeze_primary(self) -> int:
        """SIGSTOP the primary, as a node that stops answering: its connections stay open, silent."""
        frozen = self.primary
        proc = self.procs.pop(frozen)
        proc.send_signal(signal.SIGSTOP)
        self.frozen.append(proc)
        return frozen

    def lose_primary(self, how: str) -> int:
        return self.freeze_primary() if how == "frozen" else self.kill_primary()

    def wait_for_promotion(self, within: float) -> int:
        """Wait until every live sentinel names one new primary that is live; returns its port."""
        old = self.primary
        live = [s for s in self.sentinels if s in self.procs]

        def promoted() -> bool:
            seen = {self.master_seen_by(s) for s in live}
            if len(seen) != 1:
                return False
            (port,) = seen
            if port is None or port == old or port not in self.procs:
                return False
            try:
                role = node(port, self.password).info("replication").get("role")
            except (redis.RedisError, OSError):
                return False
            return role == "master"

        wait_until(promoted, within)
        (self.primary,) = {self.master_seen_by(s) for s in live}
        self.replicas = [r for r in self.replicas if r != self.primary]
        return self.primary


@contextmanager
def running_sentinels(
    folder: Path, replicas: int = 2, password: str | None = None, quorum: int = QUORUM
) -> Iterator[SentinelGroup]:
    """A primary, `replicas` replicas in sync with it, and three sentinels that have found them all."""
    folder.mkdir(parents=True, exist_ok=True)
    group = SentinelGroup(folder, password, free_port(), [free_port() for _ in range(replicas)])
    with ExitStack() as cleanup:
        for port in [group.primary, *group.replicas]:
            data = folder / f"redis-{port}"
            data.mkdir()
            primary = None if port == group.primary else group.primary
            proc = start_process(server_args(port, data, password, primary), ready_url=None)
            group.procs[port] = proc
            cleanup.callback(lambda p=port: group.procs.pop(p).stop() if p in group.procs else None)
            wait_until(lambda p=port: redis_answers_with(p, password), START_TIMEOUT, proc)
        for port in group.replicas:
            wait_until(lambda p=port: replicating(p, password), START_TIMEOUT, group.procs[port])
        for _ in range(3):
            port = free_port()
            config = sentinel_config(port, folder, group.primary, password, quorum)
            proc = start_process([_binary(), str(config), "--sentinel"], ready_url=None)
            group.sentinels.append(port)
            group.procs[port] = proc
            cleanup.callback(lambda p=port: group.procs.pop(p).stop() if p in group.procs else None)
            wait_until(lambda p=port: redis_answers(p), START_TIMEOUT, proc)
        wait_until(lambda: all(_knows_everyone(group, s) for s in group.sentinels), 30.0)
        cleanup.callback(lambda: [(p.popen.kill(), p.stop()) for p in group.frozen])
        yield group


def redis_answers_with(port: int, password: str | None) -> bool:
    if password is None:
        return redis_answers(port)
    try:
        return bool(node(port, password).ping())
    except (redis.RedisError, OSError):
        return False


def _knows_everyone(group: SentinelGroup, sentinel: int) -> bool:
    """Whether a sentinel has found every replica and the other sentinels (through the primary)."""
    try:
        client = node(sentinel)
        master = client.sentinel_master(SERVICE)
    except (redis.RedisError, OSError):
        return False
    return (
        int(master.get("num-slaves", 0)) >= len(group.replicas)
        and int(master.get("num-other-sentinels", 0)) >= len(group.sentinels) - 1
    )
