"""A database file damaged below SQLite's rows (a disk error, bytes written over it): named in one error, and
salvaged row by row.

Rows with bad values are SQLiteDatabase's concern (it skips them). A damaged page is SQLite's: any query that
walks over it fails with "database disk image is malformed", whichever command asked. Every query of a
SQLiteDatabase goes through GuardedConnection, which turns that into one DatabaseDamagedError naming the file,
what `PRAGMA integrity_check` says, and how to save what can still be read: `readable_rows` reads the records
table in ranges of row ids, and id by id within a range that fails, so only the rows on a damaged page are lost.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from tensorgen.records.record import RecordsError

CHUNK = 256  # row ids read in one query while salvaging


class DatabaseDamagedError(RecordsError):
    """The tuning database's file is damaged (SQLite says "malformed"): no query that reads a damaged page can
    succeed, so the command stops; `tensorgen db export` saves the rows that can still be read.

    Fields:
        path: the file.
        sqlite_error: SQLite's own words."""

    def __init__(self, message: str, path: str, sqlite_error: str):
        super().__init__(message)
        self.path, self.sqlite_error = path, sqlite_error


def is_damage(err: BaseException) -> bool:
    """Whether SQLite failed because the file's pages are damaged (SQLITE_CORRUPT), not for a lock or a full disk
    (sqlite3 names the code only from Python 3.11: its message is the same in every SQLite)."""
    return isinstance(err, sqlite3.DatabaseError) and "malformed" in str(err)


def integrity_summary(path: str) -> str:
    """The first problem `PRAGMA integrity_check` finds in the file at `path` ("ok" if none), or why it could not
    check. Asked for one problem only: on some damage, SQLite's own check fails once it reads on past the first."""
    if path == ":memory:":
        return "an in-memory database"
    try:
        with closing(sqlite3.connect(Path(path).absolute().as_uri() + "?mode=ro", uri=True)) as conn:
            (text,) = conn.execute("PRAGMA integrity_check(1)").fetchone()
    except sqlite3.Error as err:
        return f"SQLite cannot check it: {err}"
    lines = [line for line in str(text).splitlines() if line.strip() and not line.startswith("***")]
    return lines[0] if lines else "no answer"


def damaged_error(path: str, sqlite_error: str, salvageable: bool = True) -> DatabaseDamagedError:
    """The one error for a query that met a damaged page of the file at `path`; not `salvageable` if the damage
    is in SQLite's table of tables, so that no row can be found."""
    what = (f"`tensorgen db export SAVED.jsonl --db {path}` saves the records that can still be read, "
            f"`tensorgen db import SAVED.jsonl --db NEW.db` puts them in a new database" if salvageable else
            "SQLite cannot read its table of tables, so no record can be read from it: tune into a new database")
    return DatabaseDamagedError(f"tuning database {path!r} is damaged ({sqlite_error}; PRAGMA integrity_check: "
                                f"{integrity_summary(path)}): {what}", path, sqlite_error)


@contextmanager
def guard(path: str) -> Iterator[None]:
    """Turn SQLite's damage errors inside the block into DatabaseDamagedError (others pass unchanged)."""
    try:
        yield
    except sqlite3.DatabaseError as err:
        if is_damage(err):
            raise damaged_error(path, str(err)) from None
        raise


class GuardedCursor:
    """A sqlite3.Cursor whose reads go through `guard`."""

    def __init__(self, cursor: sqlite3.Cursor, path: str):
        self._cursor, self._path = cursor, path

    @property
    def lastrowid(self) -> int | None:
        return self._cursor.lastrowid

    def fetchone(self) -> Any:
        with guard(self._path):
            return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        with guard(self._path):
            return self._cursor.fetchall()

    def __iter__(self) -> Iterator[Any]:
        with guard(self._path):
            yield from self._cursor

    def close(self) -> None:
        self._cursor.close()


class GuardedConnection:
    """A sqlite3.Connection (autocommit) whose statements and their cursors raise DatabaseDamagedError for a
    damaged file, whichever query meets the damage."""

    def __init__(self, raw: sqlite3.Connection, path: str):
        self.raw, self._path = raw, path

    def execute(self, sql: str, args: tuple = ()) -> GuardedCursor:
        with guard(self._path):
            return GuardedCursor(self.raw.execute(sql, args), self._path)

    @property
    def in_transaction(self) -> bool:
        return self.raw.in_transaction

    def close(self) -> None:
        self.raw.close()


def readable_rows(conn: sqlite3.Connection, columns: str) -> Iterator[tuple | int]:
    """Every row of the records table that SQLite can still read, in id order, as a tuple of `columns` (the first
    being `id`); the id of a row it cannot read, as an int. Ids run up to what the table says its largest is (its
    AUTOINCREMENT counter, or its last row), whichever can be read. A range of ids is read at once; a damaged page
    fails that query or ends its scan early without a word, so each id the range did not give is asked for alone,
    and one that still gives nothing is lost (tensorgen never deletes a record)."""

    def rows(sql: str, args: tuple) -> list[tuple] | None:
        try:
            return conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as err:
            if is_damage(err):
                return None
            raise

    counters = [rows(sql, ()) for sql in ("SELECT seq FROM sqlite_sequence WHERE name = 'records'",
                                          "SELECT MAX(id) FROM records")]
    last = max([found[0][0] or 0 for found in counters if found] or [0])
    select = f"SELECT {columns} FROM records"
    for start in range(1, last + 1, CHUNK):
        found = {row[0]: row for row in rows(f"{select} WHERE id BETWEEN ? AND ?", (start, start + CHUNK - 1)) or ()}
        for rid in range(start, min(start + CHUNK, last + 1)):
            # `id = ?` is a seek; a range of one id also reads the next page, to see where the range ends
            alone = [found[rid]] if rid in found else rows(f"{select} WHERE id = ?", (rid,))
            yield from alone or [rid]
