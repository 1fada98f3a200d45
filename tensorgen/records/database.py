"""Where records live: a small Database protocol and its SQLite implementation.

One SQLite file in WAL mode holds every workload's DAG once and one row per measurement. Each commit
is its own transaction, so a tuning run killed mid-way keeps everything it committed, and a
`busy_timeout` lets several tuning processes append to the same file at once. `cost` is NULL for
failed measurements so "best" is an index range scan over (workload_key, target, cost).
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from tensorgen.records.record import (
    RECORD_FORMAT,
    Record,
    RecordFormatError,
    RecordsError,
    program_cost,
    result_to_json,
    steps_hash,
)
from tensorgen.target import Target

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 60_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS workloads (
    workload_key TEXT NOT NULL,
    target TEXT NOT NULL,
    dag TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (workload_key, target)
);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload_key TEXT NOT NULL,
    target TEXT NOT NULL,
    cost REAL,
    error_kind TEXT NOT NULL,
    steps TEXT NOT NULL,
    steps_hash TEXT NOT NULL,
    hw TEXT NOT NULL,
    result TEXT NOT NULL,
    version TEXT NOT NULL,
    format INTEGER NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS records_by_cost ON records (workload_key, target, cost);
CREATE INDEX IF NOT EXISTS records_by_state ON records (workload_key, target, steps_hash);
"""

_COLUMNS = "r.workload_key, r.target, w.dag, r.hw, r.steps, r.result, r.version, r.format"
_FROM = "FROM records r JOIN workloads w ON w.workload_key = r.workload_key AND w.target = r.target"


@runtime_checkable
class Database(Protocol):
    """What the tuner and `apply_best` need from a record store (MetaSchedule-like)."""

    def commit_record(self, record: Record) -> None: ...

    def best(self, workload_key: str, target: str) -> Record | None: ...

    def top_k(self, workload_key: str, target: str, k: int) -> list[Record]: ...

    def records(self, workload_key: str, target: str | None = None) -> list[Record]: ...

    def workloads(self) -> list[tuple[str, str, int]]: ...

    def has_state(self, workload_key: str, target: str, steps_json: str | list) -> bool: ...

    def error_counts(self, workload_key: str, target: str) -> dict[str, int]: ...

    def __len__(self) -> int: ...


def canonical_target(target: str | Target) -> str:
    """`cpu -cores=2 -mcpu=x` and `cpu -mcpu=x -cores=2` name the same records."""
    return str(Target.parse(target))


class SQLiteDatabase:
    """Records in one SQLite file (or `:memory:`); safe for several writing processes at once."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        try:
            self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        except sqlite3.Error as err:
            raise RecordsError(f"cannot open tuning database {self.path!r}: {err}") from None
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if self.path != ":memory:":
                self._retry(lambda: self._conn.execute("PRAGMA journal_mode = WAL"))
                # NORMAL in WAL mode survives a killed process; only a power cut may lose the last commits.
                self._conn.execute("PRAGMA synchronous = NORMAL")
            self._init_schema()
        except sqlite3.DatabaseError as err:
            self._conn.close()
            raise RecordsError(f"cannot open tuning database {self.path!r}: {err}") from None
        except RecordFormatError:
            self._conn.close()
            raise
        self._dags: dict[tuple[str, str], dict] = {}  # parsed DAG per workload, shared by its records

    @classmethod
    def in_memory(cls) -> SQLiteDatabase:
        return cls(":memory:")

    def _retry(self, fn, attempts: int = 50):
        """Switching to WAL takes a lock the busy handler does not wait for; retry it briefly."""
        for n in range(attempts):
            try:
                return fn()
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or n == attempts - 1:
                    raise
                time.sleep(0.05)

    def _init_schema(self) -> None:
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RecordFormatError(
                f"tuning database {self.path!r} has schema version {version}; this tensorgen reads up to "
                f"{SCHEMA_VERSION}. Upgrade tensorgen to use it."
            )
        if version == SCHEMA_VERSION:
            return
        with self._transaction():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self._conn.execute(stmt)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _transaction(self) -> _Transaction:
        return _Transaction(self._conn)

    # ---- writing -----------------------------------------------------------------------------

    def commit_record(self, record: Record) -> None:
        """Store one record in its own transaction: once this returns, the record survives a crash."""
        with self._transaction():
            self._insert(record)

    def commit_records(self, records: list[Record]) -> None:
        """Store many records in one transaction (bulk import)."""
        with self._transaction():
            for r in records:
                self._insert(r)

    def _insert(self, r: Record) -> None:
        if r.format > RECORD_FORMAT:
            raise RecordFormatError(f"cannot store a record of format {r.format} (this tensorgen: {RECORD_FORMAT})")
        target = canonical_target(r.target)
        now = time.time()
        self._conn.execute(
            "INSERT OR IGNORE INTO workloads (workload_key, target, dag, created) VALUES (?, ?, ?, ?)",
            (r.workload_key, target, json.dumps(r.dag, separators=(",", ":")), now),
        )
        cost = r.cost if r.ok and math.isfinite(r.cost) else None
        self._conn.execute(
            "INSERT INTO records (workload_key, target, cost, error_kind, steps, steps_hash, hw, result, version,"
            " format, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r.workload_key, target, cost, r.error_kind, r.steps_json, r.steps_hash, json.dumps(r.hw),
             json.dumps(result_to_json(r.result)), r.version, r.format, now),
        )

    # ---- reading -----------------------------------------------------------------------------

    def _record(self, row: tuple) -> Record:
        key, target, dag_text, hw, steps, result, version, fmt = row
        dag = self._dags.get((key, target))
        if dag is None:
            dag = self._dags[(key, target)] = json.loads(dag_text)
        data = {"format": fmt, "version": version, "workload_key": key, "target": target,
                "hw": json.loads(hw), "steps": json.loads(steps), "result": json.loads(result)}
        return Record.from_dict(data, dag=dag)

    def _query(self, sql: str, args: tuple) -> list[Record]:
        return [self._record(row) for row in self._conn.execute(f"SELECT {_COLUMNS} {_FROM} {sql}", args)]

    def best(self, workload_key: str, target: str) -> Record | None:
        found = self.top_k(workload_key, target, 1)
        return found[0] if found else None

    def top_k(self, workload_key: str, target: str, k: int) -> list[Record]:
        """The `k` fastest programs, fastest first (ties: earliest first), one record each. A program measured
        more than once (re-timed when it became a best) ranks by `program_cost` of its measurements and is
        represented by the record holding that cost."""
        rows = self._conn.execute(
            "SELECT id, steps_hash, cost FROM records WHERE workload_key = ? AND target = ? AND cost IS NOT NULL",
            (workload_key, canonical_target(target)),
        )
        runs: dict[str, list[tuple[float, int]]] = {}
        for rid, key, cost in rows:
            runs.setdefault(key, []).append((cost, rid))
        chosen = sorted(_representative(v) for v in runs.values())[:k]
        return [self._query("WHERE r.id = ?", (rid,))[0] for _, rid in chosen]

    def records(self, workload_key: str, target: str | None = None) -> list[Record]:
        """Every record of the workload (failures included), in commit order."""
        if target is None:
            return self._query("WHERE r.workload_key = ? ORDER BY r.id", (workload_key,))
        return self._query("WHERE r.workload_key = ? AND r.target = ? ORDER BY r.id",
                           (workload_key, canonical_target(target)))

    def workloads(self) -> list[tuple[str, str, int]]:
        """(workload_key, target, number of records) for every workload with records."""
        rows = self._conn.execute(
            "SELECT workload_key, target, COUNT(*) FROM records GROUP BY workload_key, target "
            "ORDER BY MIN(id)"
        )
        return [(k, t, n) for k, t, n in rows]

    def has_state(self, workload_key: str, target: str, steps_json: str | list) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM records WHERE workload_key = ? AND target = ? AND steps_hash = ? LIMIT 1",
            (workload_key, canonical_target(target), steps_hash(steps_json)),
        ).fetchone()
        return row is not None

    def error_counts(self, workload_key: str, target: str) -> dict[str, int]:
        """Number of records per error kind ("none" counts the successes)."""
        rows = self._conn.execute(
            "SELECT error_kind, COUNT(*) FROM records WHERE workload_key = ? AND target = ? GROUP BY error_kind",
            (workload_key, canonical_target(target)),
        )
        return dict(rows.fetchall())

    def __len__(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]

    def __iter__(self) -> Iterator[Record]:
        for key, target, _ in self.workloads():
            yield from self.records(key, target)

    # ---- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SQLiteDatabase:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SQLiteDatabase({self.path!r})"


def _representative(runs: list[tuple[float, int]]) -> tuple[float, int]:
    """(cost, id) of the earliest of a program's records whose cost is the program's cost."""
    cost = program_cost([c for c, _ in runs])
    return min(r for r in runs if r[0] == cost)


class _Transaction:
    """BEGIN IMMEDIATE takes the write lock up front, so a busy writer waits instead of failing later."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
