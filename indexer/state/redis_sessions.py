"""Session records in Redis: one hash and one swap list per session, with a sliding time to live.

`session:<id>` holds the principal, the stored token, the backends, the version's number and
fingerprint and the catalog it was built from; `session:<id>:swaps` the last swap records. Both
expire `session_ttl` seconds after the session's last use (every load renews them).
`session:<id>:backends` holds the session's backend sessions and lives a while longer, so that the
sweep that finds the session expired can still end them. A session's
version changes only through the swap script, a compare-and-set on its fingerprint that also
increments its number, so numbers grow by one per swap whichever replica makes it, and two replicas
computing the same change make one swap between them. `sessions` (every id) and `implied`
(principal -> session id) are indexes that the lease holder's sweep cleans of expired sessions;
`sessions:expiry` and `principal:<hash>` count the live sessions for the caps
(`indexer.state.redis_scripts` has the scripts and how they keep those counts).
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Literal, cast

import redis.asyncio as aredis

from indexer.state import redis_scripts as scripts
from indexer.state.base import (
    NO_CAPS,
    SWAPS_KEPT,
    CatalogRef,
    EndedSession,
    Room,
    RoomFull,
    SessionRecord,
    StateUnavailable,
    Swap,
    SwapChange,
    caller_digest,
)
from indexer.state.listings import digest_of, intern_backends
from indexer.state.memory import ENDED_KEPT
from indexer.state.redis import Keys, RedisCatalogs, chunks, guarded, text
from toolsearch.sessions import BackendSession, Principal, Subscription, VersionRef

ACK_TIMEOUT_MS = 1000  # how long a new session waits for its replicas' confirmation (indexer.state_acks)
# how much longer than its session a backend-sessions hash lives: more than a sweep interval (at
# most a quarter of the session ttl) and a lease hand-over
_BACKENDS_MARGIN_MS = 120_000

BackendRows = dict[bytes, bytes]


def _subscriptions(stored: str | bytes | None) -> frozenset[Subscription]:
    """The subscriptions of a session's hash field (a JSON list of [backend, URI] pairs)."""
    if not stored:
        return frozenset()
    return frozenset(Subscription(str(b), str(u)) for b, u in json.loads(stored))


def _backend_sessions(stored: BackendRows) -> dict[str, BackendSession]:
    """Backend sessions as stored: backend id -> JSON [session id, protocol version]."""
    sessions = {}
    for backend_id, value in stored.items():
        session_id, version = json.loads(value)
        sessions[text(backend_id)] = BackendSession(str(session_id), str(version))
    return sessions


def principal_key(principal: Principal) -> str:
    return json.dumps(list(principal))


def implied_field(principal: Principal, claims: str) -> str:
    """The implied hash's field of a principal's implied session for these claims (`caller_digest`)."""
    digest = caller_digest(claims)
    return principal_key(principal) + (f"#{digest}" if digest else "")


def _refuse(answer: Any, room: Room) -> None:
    """Raise `RoomFull` for a script's refusal: [scope, milliseconds until the oldest expires]."""
    if isinstance(answer, list) and len(answer) == 2:
        scope = cast(Literal["sessions", "principal"], text(answer[0]))
        limit = room.sessions if scope == "sessions" else room.per_principal
        raise RoomFull(scope, limit, int(answer[1]) / 1000)


def _swap_json(swap: Swap) -> str:
    return json.dumps(
        {"previous": swap.previous, "current": swap.current, "reason": swap.reason, "at": swap.at}
    )


def _version_ref(pair: list[Any]) -> VersionRef:
    """A version reference stored as JSON: [number, fingerprint]."""
    number, fingerprint = pair
    return VersionRef(int(number), str(fingerprint))


def _swap(data: dict[str, Any]) -> Swap:
    previous = data.get("previous")
    prev = _version_ref(previous) if previous else None
    return Swap(prev, _version_ref(data["current"]), str(data["reason"]), float(data["at"]))


class RedisSessions:
    """The `SessionStore` of replicas sharing state; listings go to the catalog store by digest."""

    shared = True

    def __init__(
        self, client: aredis.Redis, keys: Keys, catalogs: RedisCatalogs, ttl: float, acks: int = 0
    ) -> None:
        self._client, self._keys, self._catalogs = client, keys, catalogs
        self._acks = acks  # replicas that must hold a new session before it is acknowledged
        self._ttl_ms = int(ttl * 1000)
        self._backends_ttl_ms = self._ttl_ms + self._ttl_ms // 4 + _BACKENDS_MARGIN_MS
        self._ended: deque[EndedSession] = deque(maxlen=ENDED_KEPT)
        self._set_backend = client.register_script(scripts.SET_BACKEND)
        self._check = client.register_script(scripts.CHECK)
        self._create = client.register_script(scripts.CREATE)
        self._load = client.register_script(scripts.LOAD)
        self._update = client.register_script(scripts.UPDATE)
        self._subscribe = client.register_script(scripts.SUBSCRIBE)
        self._swap = client.register_script(scripts.SWAP)
        self._delete = client.register_script(scripts.DELETE)
        self._forget_implied = client.register_script(scripts.FORGET_IMPLIED)
        self._trim = client.register_script(scripts.TRIM)

    @property
    def ttl(self) -> float:
        return self._ttl_ms / 1000

    async def _backend_fields(self, record: SessionRecord) -> dict[str, str]:
        own = {backend: digest_of(listing) for backend, listing in record.own_listings.items()}
        await self._catalogs.put((own[b], listing) for b, listing in record.own_listings.items())
        return {
            "accepted": json.dumps(sorted(record.accepted)),
            "rejected": json.dumps(sorted(record.rejected_at_creation)),
            "own": json.dumps(own),
            "epochs": json.dumps(record.listed_epochs),
        }

    async def check(self, principal: Principal, room: Room) -> None:
        keys = [self._keys.expiry, self._keys.owned(principal_key(principal))]
        async with guarded("counting sessions"):
            answer = await self._check(keys=keys, args=[room.sessions, room.per_principal])
        _refuse(answer, room)

    async def create(self, record: SessionRecord, room: Room = NO_CAPS) -> str:
        fields = {
            "issuer": record.principal.issuer,
            "subject": record.principal.subject,
            "implied": "1" if record.implied else "0",
            "number": str(record.ref.number),
            "fingerprint": record.ref.fingerprint,
            "catalog": json.dumps(record.catalog),
            "created_at": repr(record.created_at),
            "capabilities": record.client_capabilities,
            "claims": record.claims,
            **await self._backend_fields(record),
        }
        if record.token:
            fields["token"] = record.token
        first = _swap_json(record.swaps[0]) if record.swaps else "{}"
        owner = principal_key(record.principal)
        keys = [self._keys.session(record.id), self._keys.swaps(record.id), self._keys.sessions]
        keys += [self._keys.implied, self._keys.expiry, self._keys.owned(owner)]
        claim = implied_field(record.principal, record.claims) if record.implied else ""
        args: list[str | int] = [record.id, self._ttl_ms, claim, first, self._keys.session("")]
        pairs = [item for pair in fields.items() for item in pair]
        args = [*args, room.sessions, room.per_principal, *pairs]
        if not self._acks:
            async with guarded("creating a session"):
                answer = await self._create(keys=keys, args=args)
            _refuse(answer, room)
            return text(answer)
        # WAIT counts the replicas that have this connection's writes: one pipeline, one connection
        async with guarded("creating a session"), self._client.pipeline(transaction=False) as pipe:
            await self._create(keys=keys, args=args, client=pipe)
            pipe.wait(self._acks, ACK_TIMEOUT_MS)
            answer, copies = await pipe.execute()
        _refuse(answer, room)
        if int(copies) < self._acks:
            # not acknowledged: a failover now could lose it, so the client is told to try again
            with contextlib.suppress(StateUnavailable):
                await self.delete(record)
            raise StateUnavailable(
                f"shared state: {copies} of {self._acks} replicas confirmed a new session within "
                f"{ACK_TIMEOUT_MS} ms (indexer.state_acks)"
            )
        return text(answer)

    async def implied(self, principal: Principal, claims: str = "") -> str | None:
        """The id the principal's implied session for these claims is stored under, if any."""
        async with guarded("reading an implied session"):
            value = await self._client.hget(self._keys.implied, implied_field(principal, claims))
        return text(value) or None

    async def load(self, session_id: str) -> SessionRecord | None:
        keys = [self._keys.session(session_id), self._keys.swaps(session_id), self._keys.expiry]
        keys.append(self._keys.backend_sessions(session_id))
        args: list[str | int] = [session_id, self._ttl_ms, self._backends_ttl_ms]
        async with guarded("reading a session"):
            answer = await self._load(keys=keys, args=args)  # a use: it lives on
        if not answer:
            return None
        flat, swap_list, backends = answer
        stored = dict(zip(flat[::2], flat[1::2], strict=True))
        backend_rows = dict(zip(backends[::2], backends[1::2], strict=True))
        decoded = await self._decode([(session_id, stored, swap_list, backend_rows)])
        return decoded[0] if decoded else None

    async def records(self) -> list[SessionRecord]:
        async with guarded("listing sessions"):
            ids = sorted(text(i) for i in await self._client.smembers(self._keys.sessions))
        rows: list[tuple[str, dict[bytes, bytes], list[bytes], BackendRows]] = []
        for part in chunks(ids):
            async with guarded("reading sessions"), self._client.pipeline(transaction=False) as pipe:
                for session_id in part:
                    pipe.hgetall(self._keys.session(session_id))
                    pipe.lrange(self._keys.swaps(session_id), 0, -1)
                    pipe.hgetall(self._keys.backend_sessions(session_id))
                answers = await pipe.execute()
            rows += [(i, *answers[3 * n : 3 * n + 3]) for n, i in enumerate(part)]
        return await self._decode(rows)

    async def _decode(
        self, rows: Sequence[tuple[str, dict[bytes, bytes], list[bytes], BackendRows]]
    ) -> list[SessionRecord]:
        """Records from stored hashes; own listings come from the catalog store by digest."""
        parsed = [
            (i, {text(k): text(v) for k, v in stored.items()}, swaps, backends)
            for i, stored, swaps, backends in rows
            if stored
        ]
        own = {i: json.loads(fields.get("own") or "{}") for i, fields, _, _ in parsed}
        listings = await self._catalogs.get(d for digests in own.values() for d in digests.values())
        records = []
        for session_id, fields, swap_list, backends in parsed:
            epochs = {b: int(e) for b, e in json.loads(fields.get("epochs") or "{}").items()}
            kept = {b: listings[d] for b, d in own[session_id].items() if d in listings}
            for backend_id in set(own[session_id]) - set(kept):
                epochs.pop(backend_id, None)  # its listing expired: due for listing again
            catalog: CatalogRef = tuple((str(b), str(d)) for b, d in json.loads(fields["catalog"]))
            record = SessionRecord(
                id=session_id,
                principal=Principal(fields.get("issuer", ""), fields.get("subject", "")),
                token=fields.get("token") or None,
                implied=fields.get("implied") == "1",
                # one object per distinct set, however many sessions this replica caches
                accepted=intern_backends(json.loads(fields.get("accepted") or "[]")),
                rejected_at_creation=intern_backends(json.loads(fields.get("rejected") or "[]")),
                own_listings=kept,
                ref=VersionRef(int(fields["number"]), fields["fingerprint"]),
                catalog=catalog,
                listed_epochs=epochs,
                created_at=float(fields.get("created_at") or 0.0),
                backend_sessions=_backend_sessions(backends),
                client_capabilities=fields.get("capabilities", ""),
                claims=fields.get("claims", ""),
                log_level=fields.get("log_level", ""),
                subscriptions=_subscriptions(fields.get("subscriptions")),
            )
            record.swaps.extend(_swap(json.loads(s)) for s in reversed(swap_list[:SWAPS_KEPT]))
            records.append(record)
        return records

    async def save(self, records: Sequence[SessionRecord]) -> None:
        for record in records:
            pairs = [item for pair in (await self._backend_fields(record)).items() for item in pair]
            async with guarded("storing a session's backends"):
                await self._update(keys=[self._keys.session(record.id)], args=pairs)

    async def swap(self, changes: Sequence[SwapChange]) -> list[int]:
        numbers: list[int] = []
        for start in range(0, len(changes), 500):
            async with guarded("swapping versions"), self._client.pipeline(transaction=False) as pipe:
                for change in changes[start : start + 500]:
                    session_id = change.record.id
                    args = [change.record.ref.fingerprint, change.fingerprint, json.dumps(change.catalog)]
                    await self._swap(
                        keys=[self._keys.session(session_id), self._keys.swaps(session_id)],
                        args=[*args, change.reason, repr(change.at), SWAPS_KEPT],
                        client=pipe,
                    )
                numbers += [max(int(n), 0) for n in await pipe.execute()]
        return numbers

    async def delete(self, record: SessionRecord) -> None:
        keys = [self._keys.session(record.id), self._keys.swaps(record.id), self._keys.sessions]
        keys += [self._keys.implied, self._keys.expiry, self._keys.backend_sessions(record.id)]
        principal = implied_field(record.principal, record.claims) if record.implied else ""
        async with guarded("ending a session"):
            await self._delete(keys=keys, args=[record.id, principal])

    async def sweep(self, also_keep: Iterable[str] = ()) -> int:
        """Drop expired sessions from the indexes and keep the listings live ones refer to.

        Returns how many expired sessions were dropped.
        """
        async with guarded("sweeping sessions"):
            await self._trim(keys=[self._keys.expiry])
            ids = [text(i) for i in await self._client.smembers(self._keys.sessions)]
            implied = {text(k): text(v) for k, v in (await self._client.hgetall(self._keys.implied)).items()}
        dead: set[str] = set()
        digests = set(also_keep)
        for part in chunks(sorted(set(ids) | set(implied.values()))):
            async with guarded("sweeping sessions"), self._client.pipeline(transaction=False) as pipe:
                for session_id in part:
                    pipe.hmget(self._keys.session(session_id), ["catalog", "own"])
                answers = await pipe.execute()
            for session_id, (catalog, own) in zip(part, answers, strict=True):
                if catalog is None:
                    dead.add(session_id)
                    continue
                digests.update(d for _, d in json.loads(catalog))
                digests.update(json.loads(own or "{}").values())
        await self._collect_ended(sorted(dead))
        async with guarded("sweeping sessions"):
            if gone := sorted(dead & set(ids)):
                await self._client.srem(self._keys.sessions, *gone)
            for principal, session_id in implied.items():
                if session_id in dead:
                    await self._forget_implied(keys=[self._keys.implied], args=[principal, session_id])
        await self._catalogs.touch(digests)
        return len(dead & set(ids))

    async def _collect_ended(self, dead: Sequence[str]) -> None:
        """Take the backend sessions of expired sessions, for `take_expired`, and forget them."""
        for part in chunks(dead):
            async with guarded("sweeping sessions"), self._client.pipeline(transaction=False) as pipe:
                for session_id in part:
                    pipe.hgetall(self._keys.backend_sessions(session_id))
                    pipe.delete(self._keys.backend_sessions(session_id))
                answers = await pipe.execute()
            for n, session_id in enumerate(part):
                if backends := _backend_sessions(answers[2 * n]):
                    # the stored token expired with the session: passthrough backends are ended
                    # without credentials, and may refuse (their idle timeout ends them then)
                    self._ended.append(EndedSession(session_id, None, backends))

    async def set_backend_session(
        self, record: SessionRecord, backend_id: str, previous: str, session: BackendSession | None
    ) -> BackendSession | None:
        keys = [self._keys.session(record.id), self._keys.backend_sessions(record.id)]
        value = json.dumps(list(session)) if session is not None else ""
        args: list[str | int] = [backend_id, previous, value, self._backends_ttl_ms]
        async with guarded("storing a backend session"):
            answer = await self._set_backend(keys=keys, args=args)
        if not answer:
            return None
        session_id, version = json.loads(text(answer))
        return BackendSession(str(session_id), str(version))

    async def set_log_level(self, record: SessionRecord, level: str) -> bool:
        async with guarded("storing a log level"):
            stored = await self._update(keys=[self._keys.session(record.id)], args=["log_level", level])
        return bool(stored)

    async def subscribe(
        self, record: SessionRecord, subscription: Subscription, subscribed: bool, limit: int
    ) -> frozenset[Subscription] | None:
        args: list[str | int] = [*subscription, "1" if subscribed else "0", limit]
        async with guarded("storing a subscription"):
            answer = await self._subscribe(keys=[self._keys.session(record.id)], args=args)
        return None if answer is None else _subscriptions(answer)

    def take_expired(self) -> list[EndedSession]:
        ended = list(self._ended)
        self._ended.clear()
        return ended

    async def close(self) -> None:
        """The connection belongs to the state backend, which closes it."""
