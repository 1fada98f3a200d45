"""Tuning records: what was measured, stored so a run can resume and the best program can be reused.

A `Record` is self-contained (it embeds the serialized DAG), so it replays without the code that built
the workload. `SQLiteDatabase` stores records durably and answers "best program for this workload";
`jsonl` moves records between databases and machines.
"""

from tensorgen.records.apply import apply_best
from tensorgen.records.damage import DatabaseDamagedError
from tensorgen.records.database import Database, SQLiteDatabase
from tensorgen.records.jsonl import ImportReport, export, import_
from tensorgen.records.record import RECORD_FORMAT, Record, RecordFormatError, RecordsError

__all__ = [
    "RECORD_FORMAT", "Database", "DatabaseDamagedError", "ImportReport", "Record", "RecordFormatError",
    "RecordsError", "SQLiteDatabase",
    "apply_best", "export", "import_",
]
