"""Records as JSON lines: one self-contained Record per line, to move tuning results between machines."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tensorgen.records.database import Database
from tensorgen.records.record import Record, RecordFormatError, RecordsError, check_dag


@dataclass
class ImportReport:
    """How many records were imported, and which lines were not, with why."""

    imported: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"imported {self.imported} record(s), skipped {len(self.skipped)}"]
        lines += [f"  line {n}: {why}" for n, why in self.skipped]
        return "\n".join(lines)


def export(db: Database, path: str | Path, workload_key: str | None = None) -> int:
    """Write every record (or one workload's) to `path`; returns how many were written."""
    keys = [workload_key] if workload_key else list(dict.fromkeys(k for k, _, _ in db.workloads()))
    return write_lines((record for key in keys for record in db.records(key)), path)


def write_lines(records: Iterable[Record], path: str | Path) -> int:
    """Write `records` to `path`, one JSON line each; returns how many were written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(record.to_json_line() + "\n")
            n += 1
    return n


def import_(db: Database, path: str | Path) -> ImportReport:
    """Add the records of a JSON-lines file to `db`.

    A line from a newer format version fails the whole import (RecordFormatError, naming the line)
    before anything is written: silently dropping what this version cannot read would lose results.
    Corrupt lines and states the database already has are skipped and reported by line number.
    """
    report = ImportReport()
    pending: list[tuple[int, Record]] = []
    verified: dict[str, dict] = {}  # workload_key -> a DAG checked to have that key
    seen: set[tuple[str, str, str]] = set()
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = Record.from_json_line(line)
                _verify_dag(record, verified)
            except RecordFormatError as err:
                raise RecordFormatError(f"{path}, line {line_no}: {err}") from None
            except RecordsError as err:
                report.skipped.append((line_no, str(err)))
                continue
            ident = (record.workload_key, record.target, record.steps_hash)
            if ident in seen or db.has_state(record.workload_key, record.target, record.steps):
                report.skipped.append((line_no, "duplicate: this state is already in the database"))
                continue
            seen.add(ident)
            pending.append((line_no, record))
    for _, record in pending:
        db.commit_record(record)
        report.imported += 1
    return report


def _verify_dag(record: Record, verified: dict[str, dict]) -> None:
    """The embedded DAG must rebuild and hash to the record's workload key (checked once per DAG)."""
    if verified.get(record.workload_key) != record.dag:
        check_dag(record.dag, record.workload_key)
        verified[record.workload_key] = record.dag
