"""The embedded state: one indexer process, sessions in its memory, embeddings in a SQLite file.

Nothing is shared, so nothing is serialised: the session store keeps the very records the session
manager works on, a swap is checked and counted here and applied by the manager, and there is no
lease (this process always probes and rebuilds) and no event channel. Sessions live until they are
closed or ended, as they always have in this mode. The embeddings' SQLite file is
`indexer.state.disk`.
"""

from __future__ import annotations

from collections.abc import Sequence

from indexer.state.base import Principal, SessionRecord, SwapChange


class LocalSessions:
    """The `SessionStore` of a single indexer: the process's own session records, by id."""

    shared = False

    def __init__(self) -> None:
        self._records: dict[str, SessionRecord] = {}
        self._implied: dict[Principal, str] = {}

    def __len__(self) -> int:
        return len(self._records)

    async def create(self, record: SessionRecord) -> str:
        if record.implied:
            existing = self._implied.get(record.principal)
            if existing in self._records:
                return existing
            self._implied[record.principal] = record.id
        self._records[record.id] = record
        return record.id

    async def implied(self, principal: Principal) -> str | None:
        return self._implied.get(principal)

    async def load(self, session_id: str) -> SessionRecord | None:
        return self._records.get(session_id)

    async def records(self) -> list[SessionRecord]:
        return list(self._records.values())

    async def save(self, records: Sequence[SessionRecord]) -> None:
        """Nothing to do: the records are the objects that changed."""

    async def swap(self, changes: Sequence[SwapChange]) -> list[int]:
        numbers = []
        for change in changes:
            record = change.record
            live = self._records.get(record.id) is record and record.ref.fingerprint != change.fingerprint
            numbers.append(record.ref.number + 1 if live else 0)
        return numbers

    async def delete(self, record: SessionRecord) -> None:
        self._records.pop(record.id, None)
        if record.implied and self._implied.get(record.principal) == record.id:
            del self._implied[record.principal]

    async def close(self) -> None:
        """Nothing is held open."""
