"""Input rounds kept with a session: read in that session only, forgotten when their time is up, and
bounded in memory (docs/gateway.md). The same in Redis, where every replica reads them:
tests/system/test_replicas_on_one_redis.py."""

from __future__ import annotations

from indexer.state.rounds import LocalRounds

TOKEN = "a-token-of-the-routers-own"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_round_is_read_in_its_own_session_only() -> None:
    rounds = LocalRounds()
    await rounds.put("one", TOKEN, '{"state":"asked"}', 30)
    assert await rounds.get("one", TOKEN) == '{"state":"asked"}'
    assert await rounds.get("two", TOKEN) is None
    assert await rounds.get("one", "another-token-altogether") is None


async def test_a_round_is_forgotten_when_its_time_is_up_and_a_rewrite_keeps_it_longer() -> None:
    clock = Clock()
    rounds = LocalRounds(clock=clock)
    await rounds.put("one", TOKEN, "asked", 10)
    clock.now = 9.0
    await rounds.put("one", TOKEN, "done", 10)  # the outcome, kept as long again
    clock.now = 15.0
    assert await rounds.get("one", TOKEN) == "done"
    clock.now = 19.5
    assert await rounds.get("one", TOKEN) is None
    assert len(rounds) == 0


async def test_memory_keeps_at_most_its_limit_the_oldest_dropped_first() -> None:
    rounds = LocalRounds(limit=2)
    for n in range(3):
        await rounds.put("one", f"{TOKEN}-{n}", str(n), 30)
    assert len(rounds) == 2
    assert await rounds.get("one", f"{TOKEN}-0") is None
    assert await rounds.get("one", f"{TOKEN}-2") == "2"
