"""The Redis state through Sentinel: real redis-server and sentinel processes on loopback.

A primary, two replicas and three sentinels (tests/support/sentinel.py); the state backend opened
in process, as an indexer replica opens it. A failover is a SIGKILL of the primary.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from commands.ports import free_port
from indexer.state import SessionRecord, StateUnavailable, Swap, make_state, state_secret
from indexer.state.listings import Listing, listing_digest
from indexer.state.redis import Keys
from indexer.state.redis_connection import client_name
from tests.support.processes import start_process
from tests.support.redis import open_state
from tests.support.sentinel import SERVICE, node, running_sentinels, sentinel_config
from tests.support.stack import CLI, MODEL, wait_until
from tests.support.waits import wait_for
from toolsearch.config import ConfigError, parse_config
from toolsearch.sessions import BackendSession, Principal, VersionRef

ALICE = Principal("https://issuer.test", "alice")
LISTING = Listing(({"name": "get_forecast", "description": "The weather tomorrow."},), "2025-11-25", 0.1)
PASSWORD = "s3ntinel-test-password"
FAILOVER_WITHIN = 60.0  # seconds: down-after (5 s), the election and the promotion, on a busy machine


def record(session_id: str) -> SessionRecord:
    created = SessionRecord(
        id=session_id,
        principal=ALICE,
        token=None,
        implied=False,
        accepted=frozenset({"weather"}),
        rejected_at_creation=frozenset(),
        own_listings={},
        ref=VersionRef(1, "a" * 32),
        catalog=(("weather", listing_digest(LISTING)),),
    )
    created.swaps.append(Swap(None, VersionRef(1, "a" * 32), "created", 1700000000.25))
    return created


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://", "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE_NAME[/DB]"),
        ("redis+sentinel://s1:26379", "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE_NAME[/DB]"),
        ("redis+sentinel://s1:port/toolsearch", "sentinel 's1:port' is not HOST:PORT"),
        ("redis+sentinel://s1:26379/tool search", "service name 'tool search'"),
        ("redis+sentinel://s1:26379/toolsearch/zero", "database 'zero' must be a number"),
        ("redis+sentinel://:pw@s1:26379/toolsearch", "name that variable in indexer.state_password_env"),
        ("sentinel://s1:26379/toolsearch", "must be 'memory', a redis:// URL or redis+sentinel://"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_naming_the_key_and_the_form(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"indexer": {"state": url}}, Path("/etc/toolsearch.yaml"))
    message = str(refused.value)
    assert "/etc/toolsearch.yaml" in message and "indexer.state:" in message and says in message


def test_a_sentinel_url_names_several_sentinels_a_service_and_a_database() -> None:
    url = "redis+sentinel://a:26379,b:26380,[::1]:26381/toolsearch/2"
    config = parse_config({"indexer": {"state": url}}, Path("toolsearch.yaml"))
    assert config.indexer.state == url


def test_a_named_password_variable_that_is_unset_is_one_line_naming_the_key() -> None:
    with pytest.raises(StateUnavailable) as refused:
        state_secret({}, "REDIS_PASSWORD", "indexer.state_password_env")
    assert str(refused.value).startswith("indexer.state_password_env: the variable REDIS_PASSWORD is not set")
    assert state_secret({"REDIS_PASSWORD": "x"}, "REDIS_PASSWORD", "indexer.state_password_env") == "x"
    assert state_secret({}, None, "indexer.state_password_env") is None


async def test_no_reachable_sentinel_is_one_line_naming_indexer_state_within_a_bound() -> None:
    url = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/{SERVICE}"
    started = time.monotonic()
    with pytest.raises(StateUnavailable) as refused:
        await open_state(url, "fake:test", 8)
    message = str(refused.value)
    assert message.startswith("indexer.state: no sentinel answered at 127.0.0.1:") and "\n" not in message
    assert time.monotonic() - started < 5.0


async def test_a_service_name_the_sentinels_do_not_watch_is_one_line_naming_indexer_state(
    tmp_path: Path,
) -> None:
    with running_sentinels(tmp_path, replicas=0) as group:
        wrong = group.url.replace(f"/{SERVICE}/", "/elsewhere/")
        with pytest.raises(StateUnavailable) as refused:
            await open_state(wrong, "fake:test", 8)
        message = str(refused.value)
        assert message.startswith("indexer.state: the sentinels at 127.0.0.1:") and "\n" not in message
        assert "watch no primary named 'elsewhere'" in message


async def test_a_wrong_or_missing_password_is_one_line_naming_the_password_key(tmp_path: Path) -> None:
    with running_sentinels(tmp_path, replicas=0, password=PASSWORD) as group:
        for given in ("not-the-password", None):
            state = make_state(group.url, "fake:test", 8, password=given)
            try:
                with pytest.raises(StateUnavailable) as refused:
                    await state.ready()
            finally:
                await state.close()
            message = str(refused.value)
            assert message.startswith("indexer.state_password_env: ") and "refused the password" in message
            assert "not-the-password" not in message
        right = make_state(group.url, "fake:test", 8, password=PASSWORD)
        try:
            await right.ready()  # the right one is let in
        finally:
            await right.close()


async def test_what_was_written_before_a_failover_is_read_and_written_after_it_without_reopening(
    tmp_path: Path,
) -> None:
    with running_sentinels(tmp_path, replicas=2, password=PASSWORD) as group:
        state = make_state(group.url, "fake:test", 8, password=PASSWORD)
        await state.ready()
        try:
            shared, embeddings = state.shared, state.embeddings
            assert shared is not None and embeddings is not None
            for number in range(20):
                await state.sessions.create(record(f"s-{number}"))
            await shared.catalogs.put([(listing_digest(LISTING), LISTING)])
            generation = await shared.health.publish({})
            first = await state.sessions.load("s-0")
            assert first is not None
            kept = BackendSession("backend-session-1", "2025-11-25")
            assert await state.sessions.set_backend_session(first, "weather", "", kept) == kept
            vector = (b"text-key", b"\x00\x01\x02\x03" * 8)
            await asyncio.to_thread(embeddings.put, [vector])

            # replication is asynchronous (only a new session waits for it: state_acks); what this
            # test holds the failover to is what the replicas had
            wait_until(group.replicated, 10.0)
            dead = group.kill_primary()
            promoted = group.wait_for_promotion(FAILOVER_WITHIN)
            assert promoted != dead

            # the same objects, no restart: the next connection asks the sentinels again
            async def served() -> bool:
                try:
                    return await state.sessions.load("s-0") is not None
                except StateUnavailable:
                    return False

            deadline = time.monotonic() + 30
            while not await served():
                assert time.monotonic() < deadline, "the state never reached the promoted replica"
                await asyncio.sleep(0.1)
            loaded = [await state.sessions.load(f"s-{number}") for number in range(20)]
            assert all(r is not None and r.ref == VersionRef(1, "a" * 32) for r in loaded)
            assert loaded[0] is not None and loaded[0].backend_sessions == {"weather": kept}
            assert (await shared.catalogs.get([listing_digest(LISTING)])).keys() == {listing_digest(LISTING)}
            assert await shared.health.generation() == generation
            assert await asyncio.to_thread(embeddings.get, [vector[0]]) == {vector[0]: vector[1]}
            await state.sessions.create(record("s-after"))  # writes go to the new primary
            assert await state.sessions.load("s-after") is not None
        finally:
            if state.embeddings is not None:
                state.embeddings.close()
            await state.close()


async def test_closing_the_state_closes_its_connections_to_the_sentinels_too(tmp_path: Path) -> None:
    with running_sentinels(tmp_path, replicas=1) as group:

        def ours() -> list[int]:
            """The sentinels that hold a connection this process opened (by its client name)."""
            named = client_name()
            return [
                port
                for port in group.sentinels
                if any(c.get("name") == named for c in node(port).client_list())
            ]

        state = make_state(group.url, "fake:test", 8)
        try:
            await state.ready()
            await state.sessions.create(record("s-1"))
            assert state.embeddings is not None
            state.embeddings.put([(b"a-key", b"a-vector")])  # its blocking client asks them too
            assert ours()  # the state asked the sentinels for the primary, under its name
        finally:
            if state.embeddings is not None:
                state.embeddings.close()
            await state.close()
        await wait_for(lambda: not ours(), within=10)  # the sentinels saw them close


async def test_when_no_failover_can_complete_every_call_fails_within_its_deadline(tmp_path: Path) -> None:
    # two of three sentinels gone: the one left cannot reach the quorum's majority, so no replica is
    # ever promoted; the state must say so call after call, never hang
    with running_sentinels(tmp_path, replicas=1) as group:
        state = make_state(group.url, "fake:test", 8)
        await state.ready()
        try:
            await state.sessions.create(record("s-1"))
            for sentinel in group.sentinels[1:]:
                group.kill(sentinel)
            group.kill_primary()
            for _ in range(5):
                started = time.monotonic()
                with pytest.raises(StateUnavailable):
                    await state.sessions.load("s-1")
                assert time.monotonic() - started < 6.0  # connect retried once, plus the sentinels asked
        finally:
            if state.embeddings is not None:
                state.embeddings.close()
            await state.close()


async def test_with_state_acks_a_session_is_on_a_replica_before_it_is_acknowledged(
    tmp_path: Path,
) -> None:
    with running_sentinels(tmp_path, replicas=1) as group:
        state = make_state(group.url, "fake:test", 8, acks=1)
        await state.ready()
        try:
            await state.sessions.create(record("s-1"))
            (replica,) = group.replicas
            assert node(replica).exists(Keys().session("s-1"))  # there at once, not eventually

            group.kill(replica)  # no replica left to confirm: refused, and nothing is left behind
            started = time.monotonic()
            with pytest.raises(StateUnavailable, match=r"0 of 1 replicas confirmed .*indexer.state_acks"):
                await state.sessions.create(record("s-2"))
            assert time.monotonic() - started < 5.0
            assert await state.sessions.load("s-2") is None
            assert await state.sessions.load("s-1") is not None
        finally:
            if state.embeddings is not None:
                state.embeddings.close()
            await state.close()


def test_an_indexer_started_on_unreachable_sentinels_exits_with_one_line_naming_the_setting(
    tmp_path: Path,
) -> None:
    sentinels = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    config = tmp_path / "toolsearch.yaml"
    config.write_text(
        f"indexer:\n  listen: 127.0.0.1:{free_port()}\n  model: {MODEL}\n  cache_dir: {tmp_path}\n"
    )
    env = {"TOOLSEARCH_INDEXER_STATE": f"redis+sentinel://{sentinels}/{SERVICE}"}
    proc = start_process([*CLI, "indexer", "--config", str(config)], ready_url=None, env=env)
    output = proc.wait_exit(120)
    assert proc.returncode == 1, output
    (line,) = [line for line in output.splitlines() if line.startswith("indexer: ")]
    assert line.startswith(f"indexer: indexer.state: no sentinel answered at {sentinels.replace(',', ', ')}")
    assert "Traceback" not in output


async def test_sentinels_that_disagree_elect_the_majoritys_primary_and_a_tie_is_unavailable_at_once(
    tmp_path: Path,
) -> None:
    # rogue sentinels, asked first, name the replica as the primary of the same service
    with running_sentinels(tmp_path, replicas=1) as group:
        (replica,) = group.replicas
        rogues = []
        try:
            for _ in range(3):
                port = free_port()
                config = sentinel_config(port, tmp_path, replica, None, 1)
                proc = start_process(
                    [shutil.which("redis-server") or "redis-server", str(config), "--sentinel"], None
                )
                rogues.append((port, proc))
                wait_until(lambda p=port: group.master_seen_by(p) == replica, 10.0, proc)
            for count, expected in ((1, "written"), (3, "unavailable")):  # 3 true against 1, then 3 against 3
                hosts = ",".join(f"127.0.0.1:{port}" for port, _ in rogues[:count])
                url = group.url.replace("redis+sentinel://", f"redis+sentinel://{hosts},")
                state = make_state(url, "fake:test", 8)
                try:
                    for number in range(5):
                        started = time.monotonic()
                        try:
                            await state.sessions.create(record(f"s-{count}-{number}"))
                            outcome = "written"
                        except StateUnavailable:
                            outcome = "unavailable"
                        assert outcome == expected, (count, number)
                        assert time.monotonic() - started < 2.0  # the sentinels answer from memory
                finally:
                    if state.embeddings is not None:
                        state.embeddings.close()
                    await state.close()
            assert node(group.primary).exists(Keys().session("s-1-0"))  # on the real primary
        finally:
            for _, proc in rogues:
                proc.stop()
