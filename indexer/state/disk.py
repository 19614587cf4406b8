"""The SQLite embedding store: the second tier of one indexer's embedding cache (memory state).

One SQLite file per model identity in `cache_dir`, in WAL mode, written one transaction per model
call. SQLite rather than our own segment files because it already is what those would have to
become: a kill at any point leaves the last committed transaction, never a torn record; lookups by
key need no in-memory index of the whole cache; and several processes can share one folder. What
SQLite cannot rule out (a file damaged outside it, a disk that lies) is checked on open
(`PRAGMA quick_check`) and, by the cache reading it, on every read (a stored vector must have the
model's dimension and unit norm): a damaged file is moved aside to `*.corrupt` and started anew, a
bad row is re-embedded and overwritten. The store is best effort: when it cannot be used, the cache
runs from memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

_log = logging.getLogger(__name__)

_SCHEMA_VERSION = "1"
_SQL_VARIABLES = 500  # keys per SELECT, under SQLite's bound-parameter limit
_CORRUPTION_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


class _Corrupt(Exception):
    """Raised when a cache file opens but is not one of ours, or fails its integrity check."""


class DiskEmbeddings:
    """Key -> vector bytes in one SQLite file; every method is thread-safe and never raises."""

    def __init__(self, folder: Path, identity: str, dimension: int) -> None:
        self._path = folder / f"embeddings-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.sqlite3"
        self._identity = identity
        self._dimension = dimension
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._connection = self._open()
        except (_Corrupt, sqlite3.DatabaseError) as exc:
            if not self._is_corruption(exc):
                _log.warning("embedding cache %s unusable, running from memory: %s", self._path, exc)
                return
            self._reset(exc)
        except OSError as exc:
            _log.warning("embedding cache folder %s unusable, running from memory: %s", folder, exc)

    def _open(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self._path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            connection.execute("PRAGMA page_size=16384")  # takes on a new file only: fewer half-empty pages
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a kill loses no commit
            check = connection.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise _Corrupt(f"integrity check failed: {check}")
            connection.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            # a rowid table: WITHOUT ROWID stores rows this large (1.5 kB) in a third more pages
            connection.execute(
                "CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vector BLOB NOT NULL)"
            )
            expected = {
                "version": _SCHEMA_VERSION,
                "identity": self._identity,
                "dimension": str(self._dimension),
            }
            connection.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)", expected.items())
            found = dict(connection.execute("SELECT name, value FROM meta").fetchall())
            if any(found.get(name) != value for name, value in expected.items()):
                raise _Corrupt(f"file belongs to another model or version: {found}")
        except BaseException:
            connection.close()
            raise
        return connection

    @staticmethod
    def _is_corruption(exc: BaseException) -> bool:
        if isinstance(exc, _Corrupt):
            return True
        code = getattr(exc, "sqlite_errorcode", None)  # extended codes keep the primary in the low byte
        return isinstance(code, int) and code & 0xFF in _CORRUPTION_CODES

    def _reset(self, reason: BaseException) -> None:
        """Move a damaged file aside and start an empty one; its vectors are re-embedded when needed."""
        _log.warning("embedding cache %s is damaged (%s): moved aside, starting anew", self._path, reason)
        if self._connection is not None:
            with contextlib.suppress(sqlite3.Error):
                self._connection.close()
            self._connection = None
        try:
            self._path.replace(self._path.with_suffix(".corrupt"))
            for suffix in ("-wal", "-shm"):
                Path(f"{self._path}{suffix}").unlink(missing_ok=True)
            self._connection = self._open()
        except (OSError, _Corrupt, sqlite3.Error) as exc:
            _log.warning("embedding cache %s unusable, running from memory: %s", self._path, exc)

    def _failed(self, action: str, exc: sqlite3.Error) -> None:
        if self._is_corruption(exc):
            self._reset(exc)
        else:
            _log.warning("embedding cache %s: %s failed: %s", self._path, action, exc)

    def get(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """The stored vectors of those `keys` that are on disk."""
        found: dict[bytes, bytes] = {}
        with self._lock:
            if self._connection is None:
                return found
            try:
                for start in range(0, len(keys), _SQL_VARIABLES):
                    chunk = keys[start : start + _SQL_VARIABLES]
                    marks = ",".join("?" * len(chunk))
                    rows = self._connection.execute(
                        f"SELECT key, vector FROM vectors WHERE key IN ({marks})", chunk
                    ).fetchall()
                    found.update(rows)
            except sqlite3.Error as exc:
                self._failed("read", exc)
        return found

    def put(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Store `items` in one transaction: all of them or, after a kill, none."""
        with self._lock:
            if self._connection is None or not items:
                return
            try:
                self._connection.execute("BEGIN IMMEDIATE")
                try:
                    self._connection.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?)", items)
                    self._connection.execute("COMMIT")
                except BaseException:
                    self._connection.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                self._failed("write", exc)

    def close(self) -> None:
        """Close the file; the last connection's close folds the WAL back into it."""
        with self._lock:
            if self._connection is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._connection.close()
                self._connection = None


def disk_embeddings(cache_dir: Path | None, identity: str, dimension: int) -> DiskEmbeddings | None:
    """The SQLite embedding store in `cache_dir` (none without a folder)."""
    return DiskEmbeddings(cache_dir, identity, dimension) if cache_dir is not None else None
