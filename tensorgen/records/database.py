"""Where records live: a small Database protocol and its SQLite implementation.

One SQLite file in WAL mode holds every workload's DAG once and one row per measurement. Each commit
is its own transaction, so a tuning run killed mid-way keeps everything it committed, and a
`busy_timeout` lets several tuning processes append to the same file at once. `cost` is NULL for
failed measurements so "best" is an index range scan over (workload_key, target, cost).

A file can be damaged outside tensorgen (a disk error, a hand edit, a newer tensorgen's records): every
reader skips a row it cannot decode with one warning per kind of fault and counts it in `corrupt`, so one
bad row never hides the good ones. A database opened for writing is probed for writability at once, so a
read-only file stops a tuning run before anything is measured.

Each tuning call is a run (the `runs` table: when, what was asked, how it ended) and each record carries its run
and round, for the tuning report's curves. A database made before runs were kept gets the table and the two
columns (NULL for its old records) when it is opened for writing; the file stays readable by older tensorgens.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tensorgen.dag import ComputeDAG
from tensorgen.dag_json import dag_from_json
from tensorgen.records.columns import RowFault, Undecodable, decode_text, json_column, json_object
from tensorgen.records.damage import (
    DatabaseDamagedError,
    GuardedConnection,
    damaged_error,
    is_damage,
    readable_rows,
)
from tensorgen.records.history import Measurement, Run
from tensorgen.records.record import (
    RECORD_FORMAT,
    DatabaseWriteError,
    Record,
    RecordFormatError,
    RecordsError,
    check_dag,
    program_cost,
    result_to_json,
    steps_hash,
)
from tensorgen.target import Target

LOGGER = logging.getLogger("tensorgen.records")

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

# added to a schema-1 database when it is opened for writing (see _add_history)
_RUNS = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started REAL NOT NULL,
    finished REAL,
    info TEXT NOT NULL,
    outcome TEXT
)
"""
_HISTORY_COLUMNS = ("run", "round")

_COLUMNS = "id, workload_key, target, hw, steps, result, version, format"
_MEASUREMENT_COLUMNS = "id, workload_key, target, cost, error_kind, steps_hash, created"


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

    # optional: the tuning history (subclass the protocol to inherit these defaults, which keep none)

    def begin_run(self, info: Mapping[str, Any]) -> int | None:
        """A tuning run starts (`info`: what it was asked to do); the records committed from now on belong to it.
        Returns the run's id (None: runs are not kept)."""
        return None

    def begin_round(self, index: int) -> None:
        """The records committed from now on were measured in round `index` of the current run."""

    def end_run(self, outcome: Mapping[str, Any]) -> None:
        """The current run ended (`outcome`: trials, why it stopped)."""


def canonical_target(target: str | Target) -> str:
    """`cpu -cores=2 -mcpu=x` and `cpu -mcpu=x -cores=2` name the same records."""
    return str(Target.parse(target))


def _unwritable(path: str) -> str | None:
    """Why `path` (or the journal files SQLite creates beside it) cannot be written, if the OS says so."""
    file = Path(path).absolute()
    if file.exists() and not os.access(file, os.W_OK):
        return "the file is not writable"
    if not file.parent.is_dir():
        return f"its directory {str(file.parent)!r} does not exist"
    if not os.access(file.parent, os.W_OK):
        return f"its directory {str(file.parent)!r} is not writable (SQLite keeps its journal files beside the file)"
    return None


class SQLiteDatabase:
    """Records in one SQLite file (or `:memory:`); safe for several writing processes at once.

    `readonly` opens an existing database for reading only: nothing is created or converted, and no write
    access is needed. Otherwise the file is created if missing and must be writable (DatabaseWriteError).
    `corrupt` maps the id of every row skipped as unreadable to the kind of its fault."""

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = str(path)
        self.readonly = readonly
        self.corrupt: dict[int, str] = {}
        self._dags: dict[tuple[str, str], dict | RowFault] = {}  # each workload's DAG, checked once
        self._run: int | None = None  # the run and round the records committed now belong to
        self._round: int | None = None
        self.history = False  # whether the file keeps runs and rounds (see _add_history)
        if Path(self.path).is_dir():  # SQLite would say "unable to open database file"
            raise RecordsError(f"tuning database {self.path!r} is a directory; give a database file, e.g. "
                               f"{str(Path(self.path) / 'tuning.db')!r}")
        try:
            self._open(immutable=False)
        except sqlite3.DatabaseError as err:
            if not (readonly and self.path != ":memory:" and _unwritable(self.path)):
                raise self._open_error(err) from None
            try:  # in WAL mode even a reader needs a -shm file beside the database, and none can be made there
                self._open(immutable=True)
            except sqlite3.DatabaseError as err:
                raise self._open_error(err) from None

    def _open(self, immutable: bool) -> None:
        """Connect and check the schema (and writability, unless read-only). `immutable` reads the file as it
        is, without locks or the write-ahead log: only for a place no one can write to, hence no one is."""
        if immutable:
            wal = Path(self.path + "-wal")
            if wal.exists() and wal.stat().st_size:
                LOGGER.warning("tuning database %r is in a read-only place; reading it without its write-ahead log "
                               "%s, whose last commits are not seen", self.path, wal)
            conn = sqlite3.connect(Path(self.path).absolute().as_uri() + "?immutable=1", uri=True,
                                   isolation_level=None)
        else:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        conn.text_factory = decode_text
        self._conn = GuardedConnection(conn, self.path)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if self.path != ":memory:" and not self.readonly:
                self._retry(lambda: conn.execute("PRAGMA journal_mode = WAL"))
                # NORMAL in WAL mode survives a killed process; only a power cut may lose the last commits.
                conn.execute("PRAGMA synchronous = NORMAL")
            try:
                self._init_schema()
                if not self.readonly:
                    self._add_history()
                self.history = self._has_history()
            except DatabaseDamagedError as err:  # what opening reads is SQLite's table of tables
                raise damaged_error(self.path, err.sqlite_error, salvageable=False) from None
            if not self.readonly:
                self._probe_write()
        except BaseException:
            conn.close()
            raise

    @classmethod
    def in_memory(cls) -> SQLiteDatabase:
        return cls(":memory:")

    def _open_error(self, err: sqlite3.Error) -> RecordsError:
        if is_damage(err):
            return damaged_error(self.path, str(err), salvageable=False)
        why = None if self.path == ":memory:" else _unwritable(self.path)
        if not self.readonly and (why or "readonly" in str(err)):
            return DatabaseWriteError(f"cannot write to tuning database {self.path!r}: {why or err}; tuning stores "
                                      f"every measurement in it (make it writable, or pass another database)")
        return RecordsError(f"cannot open tuning database {self.path!r}: {err}" + (f" ({why})" if why else ""))

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
        if self.readonly:
            raise RecordsError(f"{self.path!r} is not a tensorgen tuning database (it has no record tables)")
        with self._transaction():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self._conn.execute(stmt)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _has_history(self) -> bool:
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(records)")}
        runs = self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'").fetchone()
        return runs is not None and columns.issuperset(_HISTORY_COLUMNS)

    def _add_history(self) -> None:
        """Give a database made before tuning runs were kept the `runs` table and the records' `run` and `round`
        columns (NULL for the records it holds). Only additions: the tensorgen that made the file still reads and
        writes it."""
        if self._has_history():
            return
        with self._transaction():
            columns = {row[1] for row in self._conn.execute("PRAGMA table_info(records)")}
            for name in _HISTORY_COLUMNS:  # another process may have added them since the check above
                if name not in columns:
                    self._conn.execute(f"ALTER TABLE records ADD COLUMN {name} INTEGER")
            self._conn.execute(_RUNS)

    def _probe_write(self) -> None:
        """Write the header in a transaction that is rolled back: SQLite opens a file it may not write
        read-only without a word, and would say so only at the first commit, after a batch was measured."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        finally:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE takes the write lock up front, so a busy writer waits instead of failing later."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if self._conn.in_transaction:  # SQLite has already rolled back after some errors (a full disk)
                self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    # ---- writing -----------------------------------------------------------------------------

    def commit_record(self, record: Record) -> None:
        """Store one record in its own transaction: once this returns, the record survives a crash."""
        self.commit_records([record])

    def commit_records(self, records: list[Record]) -> None:
        """Store records in one transaction. A failed write (full disk, file made read-only) is one
        DatabaseWriteError; the records committed before stay in the file."""
        try:
            with self._transaction():
                for r in records:
                    self._insert(r)
        except sqlite3.Error as err:
            raise self._write_error("store records in", err) from None

    def _write_error(self, what: str, err: sqlite3.Error) -> DatabaseWriteError:
        why = _unwritable(self.path) if self.path != ":memory:" else None
        return DatabaseWriteError(f"cannot {what} tuning database {self.path!r}: {err}" + (f" ({why})" if why else "")
                                  + "; every record committed before is kept")

    def _insert(self, r: Record) -> None:
        if r.format > RECORD_FORMAT:
            raise RecordFormatError(f"cannot store a record of format {r.format} (this tensorgen: {RECORD_FORMAT})")
        target = canonical_target(r.target)
        now = time.time()
        dag_text = json.dumps(r.dag, separators=(",", ":"))
        self._conn.execute(
            "INSERT OR IGNORE INTO workloads (workload_key, target, dag, created) VALUES (?, ?, ?, ?)",
            (r.workload_key, target, dag_text, now),
        )
        if isinstance(self._workload_dag(r.workload_key, target), RowFault):  # it would hide the new record
            self._conn.execute("UPDATE workloads SET dag = ? WHERE workload_key = ? AND target = ?",
                               (dag_text, r.workload_key, target))
            del self._dags[(r.workload_key, target)]
        cost = r.cost if r.ok and math.isfinite(r.cost) else None
        self._conn.execute(
            "INSERT INTO records (workload_key, target, cost, error_kind, steps, steps_hash, hw, result, version,"
            " format, created, run, round) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r.workload_key, target, cost, r.error_kind, r.steps_json, r.steps_hash, json.dumps(r.hw),
             json.dumps(result_to_json(r.result)), r.version, r.format, now, self._run, self._round),
        )

    # ---- tuning runs -------------------------------------------------------------------------

    def begin_run(self, info: Mapping[str, Any]) -> int:
        """Start a tuning run: the records this connection commits from now on belong to it (see Database)."""
        try:
            with self._transaction():
                cursor = self._conn.execute("INSERT INTO runs (started, info) VALUES (?, ?)",
                                            (time.time(), json.dumps(dict(info), default=str)))
        except sqlite3.Error as err:
            raise self._write_error("record a tuning run in", err) from None
        self._run, self._round = cursor.lastrowid, None
        return self._run

    def begin_round(self, index: int) -> None:
        self._round = index

    def end_run(self, outcome: Mapping[str, Any]) -> None:
        """Close the current run with its outcome (a run never closed was killed)."""
        if self._run is None:
            return
        try:
            with self._transaction():
                self._conn.execute("UPDATE runs SET finished = ?, outcome = ? WHERE id = ?",
                                   (time.time(), json.dumps(dict(outcome), default=str), self._run))
        except sqlite3.Error as err:
            raise self._write_error("close a tuning run in", err) from None
        self._run = self._round = None

    # ---- reading -----------------------------------------------------------------------------

    def _workload_dag(self, key: str, target: str) -> dict | RowFault:
        """The workload's DAG data, or why it is unusable; read and checked once per connection."""
        found = self._dags.get((key, target))
        if found is None:
            row = self._conn.execute("SELECT dag FROM workloads WHERE workload_key = ? AND target = ?",
                                     (key, target)).fetchone()
            try:
                if row is None:
                    raise RowFault("bad DAG", "no DAG is stored for its workload")
                found = json_column("the workload's DAG", row[0])
                check_dag(found, key)
            except RowFault as fault:
                found = RowFault("bad DAG", fault.reason)
            except RecordFormatError as err:
                found = RowFault("newer format", f"the workload's DAG: {err}")
            except RecordsError as err:
                found = RowFault("bad DAG", f"the workload's DAG: {err}")
            self._dags[(key, target)] = found
        return found

    def _decode(self, row: tuple) -> Record | None:
        """The row as a Record, or None after reporting why it is unreadable."""
        rid, key, target, hw, steps, result, version, fmt = row
        try:
            for name, value in (("workload_key", key), ("target", target), ("version", version)):
                if isinstance(value, Undecodable):
                    raise RowFault("not UTF-8", f"{name} holds bytes that are not UTF-8")
            data = {"format": fmt, "version": version, "workload_key": key, "target": target,
                    "hw": json_column("hw", hw), "steps": json_column("steps", steps),
                    "result": json_column("result", result)}
            dag = self._workload_dag(key, target)
            if isinstance(dag, RowFault):
                raise dag
            return Record.from_dict(data, dag=dag)
        except RowFault as fault:
            self._skip(rid, fault)
        except RecordFormatError as err:
            self._skip(rid, RowFault("newer format", str(err)))
        except RecordsError as err:
            self._skip(rid, RowFault("malformed", str(err)))
        return None

    def _skip(self, rid: int, fault: RowFault) -> None:
        if rid in self.corrupt:
            return
        first = fault.kind not in self.corrupt.values()
        self.corrupt[rid] = fault.kind
        if first:
            LOGGER.warning("tuning database %r: skipping record %d: %s (other records with this fault (%s) are "
                           "skipped without a warning)", self.path, rid, fault.reason, fault.kind)

    def corrupt_summary(self) -> str:
        """'' if no row was skipped, else how many were, by kind of fault."""
        if not self.corrupt:
            return ""
        kinds = ", ".join(f"{kind}: {n}" for kind, n in sorted(Counter(self.corrupt.values()).items()))
        return f"{len(self.corrupt)} unreadable record(s) skipped ({kinds})"

    def _query(self, sql: str, args: tuple) -> Iterator[Record]:
        cursor = self._conn.execute(f"SELECT {_COLUMNS} FROM records {sql}", args)
        try:
            for row in cursor:
                record = self._decode(row)
                if record is not None:
                    yield record
        finally:
            cursor.close()

    def ranked(self, workload_key: str, target: str) -> Iterator[Record]:
        """The successful programs, fastest first (ties: earliest first), one record each, read as they are
        consumed. A program measured more than once (re-timed when it became a best) ranks by `program_cost` of
        its measurements and is represented by the earliest record holding that cost."""
        rows = self._conn.execute(
            "SELECT id, steps_hash, cost FROM records WHERE workload_key = ? AND target = ? AND cost IS NOT NULL",
            (workload_key, canonical_target(target)),
        ).fetchall()
        runs: dict[str, list[tuple[float, int]]] = {}
        for rid, key, cost in rows:
            runs.setdefault(key, []).append((cost, rid))
        for _, rid in sorted(_representative(v) for v in runs.values()):
            yield from self._query("WHERE id = ?", (rid,))

    def best(self, workload_key: str, target: str) -> Record | None:
        found = self.top_k(workload_key, target, 1)
        return found[0] if found else None

    def top_k(self, workload_key: str, target: str, k: int) -> list[Record]:
        """The `k` fastest programs (see `ranked`), one record each."""
        ranked = self.ranked(workload_key, target)
        try:
            return list(islice(ranked, int(k)))
        finally:
            ranked.close()

    def records(self, workload_key: str, target: str | None = None) -> list[Record]:
        """Every readable record of the workload (failures included), in commit order."""
        if target is None:
            return list(self._query("WHERE workload_key = ? ORDER BY id", (workload_key,)))
        return list(self._query("WHERE workload_key = ? AND target = ? ORDER BY id",
                                (workload_key, canonical_target(target))))

    def workloads(self) -> list[tuple[str, str, int]]:
        """(workload_key, target, number of records) for every workload with records; a workload whose key
        or target is not UTF-8 cannot be asked for, so its records are reported as skipped instead."""
        rows = self._conn.execute(
            "SELECT workload_key, target, COUNT(*), MIN(id) FROM records GROUP BY workload_key, target "
            "ORDER BY MIN(id)"
        ).fetchall()
        out = []
        for key, target, n, first in rows:
            if isinstance(key, Undecodable) or isinstance(target, Undecodable):
                fault = RowFault("not UTF-8", "its workload_key or target holds bytes that are not UTF-8")
                for (rid,) in self._conn.execute(
                        "SELECT r.id FROM records r JOIN records f ON f.id = ? "
                        "WHERE r.workload_key = f.workload_key AND r.target = f.target ORDER BY r.id", (first,)):
                    self._skip(rid, fault)
            else:
                out.append((key, target, n))
        return out

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

    # ---- the tuning history ------------------------------------------------------------------

    def measurements(self, workload_key: str | None = None) -> list[Measurement]:
        """Every measurement (of one workload, or all), in commit order, without decoding programs: what the
        tuning report's curves need. A row with a damaged column is skipped (and counted in `corrupt`)."""
        columns = _MEASUREMENT_COLUMNS + (", " + ", ".join(_HISTORY_COLUMNS) if self.history else "")
        where, args = ("WHERE workload_key = ? ", (workload_key,)) if workload_key is not None else ("", ())
        out = []
        for row in self._conn.execute(f"SELECT {columns} FROM records {where}ORDER BY id", args).fetchall():
            rid, key, target, cost, kind, shash, created, *tags = row
            try:
                if any(isinstance(v, Undecodable) for v in (key, target, kind, shash)):
                    raise RowFault("not UTF-8", "a text column holds bytes that are not UTF-8")
                if not all(v is None or isinstance(v, (int, float)) for v in (cost, created, *tags)):
                    raise RowFault("malformed", "a number column holds text")
                out.append(Measurement(rid, key, target, math.inf if cost is None else float(cost), str(kind),
                                       str(shash), float(created), *tags))
            except RowFault as fault:
                self._skip(rid, fault)
        return out

    def runs(self) -> list[Run]:
        """The tuning runs, oldest first (none in a database made before runs were kept)."""
        if not self.history:
            return []
        out = []
        for rid, started, finished, info, outcome in self._conn.execute(
                "SELECT id, started, finished, info, outcome FROM runs ORDER BY id").fetchall():
            if isinstance(started, (int, float)) and (finished is None or isinstance(finished, (int, float))):
                out.append(Run(rid, float(started), None if finished is None else float(finished),
                               json_object(info), json_object(outcome)))
        return out

    def salvage(self, workload_key: str | None = None) -> Iterator[Record]:
        """Every record (of one workload, or all) that SQLite can still read from a damaged file, in commit order
        (see damage.readable_rows); a row on a damaged page, or whose workload's DAG is on one, is counted in
        `corrupt` as a "damaged page"."""
        for row in readable_rows(self._conn.raw, _COLUMNS):
            if isinstance(row, int):
                self._skip(row, RowFault("damaged page", "it is on a page SQLite cannot read"))
                continue
            rid, key, target = row[:3]
            if workload_key is not None and key != workload_key:
                continue
            try:
                record = self._decode(row)
            except DatabaseDamagedError:
                self._dags[(key, target)] = RowFault("damaged page", "its workload's DAG is on a page SQLite "
                                                                   "cannot read")
                record = self._decode(row)
            if record is not None:
                yield record

    def run_records(self, run: int) -> int:
        """How many records tuning run `run` committed (0 in a database made before runs were kept)."""
        if not self.history:
            return 0
        return self._conn.execute("SELECT COUNT(*) FROM records WHERE run = ?", (run,)).fetchone()[0]

    def workload_dag(self, workload_key: str, target: str) -> ComputeDAG | None:
        """The workload's DAG as stored with its records (None if it is missing or unreadable)."""
        found = self._workload_dag(workload_key, canonical_target(target))
        return None if isinstance(found, RowFault) else dag_from_json(found)

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
