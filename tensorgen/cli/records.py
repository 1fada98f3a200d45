"""`tensorgen db ...`: inspect, export and import tuning databases from the command line."""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections import Counter

from tensorgen.cli.args import examples, output_file, target_name, write_json
from tensorgen.errors import TensorgenError
from tensorgen.records.damage import DatabaseDamagedError
from tensorgen.records.database import SQLiteDatabase
from tensorgen.records.jsonl import export, import_, write_lines
from tensorgen.records.record import Record, RecordsError
from tensorgen.schedule.state import State

DEFAULT_DB = "tuning.db"
LOGGER = logging.getLogger("tensorgen.records")


def interrupted_line(trials: int, db: str, since: float) -> str:
    """The one line `tensorgen tune` prints when Ctrl-C or SIGTERM stops it, with what the run it started at `since`
    (time.time()) or later committed to `db`, counted there: its `trials` leave out the re-timings of a best and
    the interrupted batch's measurements, which are committed too."""
    committed = run_committed(db, since)
    if committed is None:
        return f"tensorgen: interrupted after {trials} trials; every measured record is in {db}"
    return f"tensorgen: interrupted after {trials} trials; this run's {committed} measurement(s) are in {db}"


def run_committed(db: str, since: float) -> int | None:
    """How many records the tuning runs started at `since` or later (a model's ALT tuning makes two) committed to
    the database file `db` (None: an in-memory database, or no such run in it)."""
    if not os.path.isfile(db):
        return None
    with SQLiteDatabase(db, readonly=True) as store:
        runs = [run for run in store.runs() if run.started >= since]
        return sum(store.run_records(run.id) for run in runs) if runs else None


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `db` command group to a `tensorgen` argument parser's subparsers."""
    db = subparsers.add_parser("db", help="inspect, export and import tuning records",
                               epilog=examples("tensorgen db stats", "tensorgen db best 14d8405700b7",
                                               "tensorgen db export records.jsonl --db tuning.db",
                                               "tensorgen db import records.jsonl --db other.db"))
    sub = db.add_subparsers(dest="db_command", required=True)

    def with_db(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--db", default=DEFAULT_DB, help=f"the tuning database (default {DEFAULT_DB})")
        return p

    stats = with_db(sub.add_parser("stats", help="workloads with record counts, best cost and errors by kind",
                                   epilog=examples("tensorgen db stats --db tuning.db --json stats.json")))
    stats.add_argument("--json", type=output_file, metavar="F", help="also write the statistics to this JSON file")
    stats.set_defaults(fn=_stats)

    best = with_db(sub.add_parser("best", help="the best program of a workload as Python steps, with its speed",
                                  epilog=examples("tensorgen db best 14d8405700b7   # a key of `tensorgen db stats`")))
    best.add_argument("workload_key", help="a workload key (or a unique prefix of one)")
    best.add_argument("--target", type=target_name,
                      help="only this target (default: every target the workload was tuned for)")
    best.add_argument("--json", type=output_file, metavar="F", help="also write the result to this JSON file")
    best.set_defaults(fn=_best)

    exp = with_db(sub.add_parser("export", help="write records as JSON lines",
                                 epilog=examples("tensorgen db export records.jsonl --db tuning.db")))
    exp.add_argument("file", type=output_file, help="the JSON-lines file to write")
    exp.add_argument("--workload", metavar="KEY", help="only this workload")
    exp.set_defaults(fn=_export)

    imp = with_db(sub.add_parser("import", help="add the records of a JSON-lines file (creates the database)",
                                 epilog=examples("tensorgen db import records.jsonl --db tuning.db")))
    imp.add_argument("file", help="the JSON-lines file to read")
    imp.set_defaults(fn=_import)
    return db


def open_existing(path: str) -> SQLiteDatabase:
    """Open a database that must already exist, for reading: reading must not create an empty file by accident,
    and needs no write access."""
    if not os.path.exists(path):
        raise RecordsError(f"tuning database {path!r} does not exist (pass --db FILE)")
    return SQLiteDatabase(path, readonly=True)


def report_unreadable(db: SQLiteDatabase) -> None:
    """Say how many rows a command skipped as unreadable (each kind was already warned about once)."""
    if db.corrupt:
        print(f"{db.path}: {db.corrupt_summary()}")


def best_program(db: SQLiteDatabase, workload_key: str, target: str) -> tuple[Record, State] | None:
    """The fastest record whose steps replay on its DAG, with its State; one that does not is skipped, with a
    warning, for the next fastest."""
    for record in db.ranked(workload_key, target):
        try:
            return record, record.state()
        except TensorgenError as err:
            LOGGER.warning("tuning database %r: skipping a record of workload %s (%.4g ms): its steps do not "
                           "replay: %s", db.path, workload_key, record.cost * 1e3, err)
    return None


def _gflops(record: Record | None) -> float | None:
    if record is None or not math.isfinite(record.cost) or record.cost <= 0:
        return None
    return record.compute_dag.flop_count / record.cost / 1e9


def _fmt_ms(cost: float | None) -> str:
    return "-" if cost is None else f"{cost * 1e3:.4f}"


def _stats(args: argparse.Namespace) -> int:
    with open_existing(args.db) as db:
        rows = []
        for key, target, _ in db.workloads():
            records = db.records(key, target)  # every row decoded, so the counts leave out unreadable ones
            errors = Counter(r.error_kind for r in records)
            best = min((r for r in records if r.ok and math.isfinite(r.cost)), key=lambda r: r.cost, default=None)
            rows.append({
                "workload_key": key, "target": target, "records": len(records), "ok": errors.pop("none", 0),
                "best_cost": best.cost if best else None, "best_gflops": _gflops(best), "errors": dict(errors),
            })
        unreadable, unreadable_note = dict(Counter(db.corrupt.values())), db.corrupt_summary()
    print(f"{args.db}: {len(rows)} workload(s), {sum(r['records'] for r in rows)} record(s)")
    if rows:
        print(f"{'workload':24s}  {'target':24s}  {'records':>7s}  {'ok':>6s}  {'best ms':>10s}  "
              f"{'GFLOP/s':>8s}  errors")
    for r in rows:
        gf = "-" if r["best_gflops"] is None else f"{r['best_gflops']:.2f}"
        errs = " ".join(f"{k}={n}" for k, n in sorted(r["errors"].items())) or "-"
        print(f"{r['workload_key']:24s}  {r['target']:24s}  {r['records']:7d}  {r['ok']:6d}  "
              f"{_fmt_ms(r['best_cost']):>10s}  {gf:>8s}  {errs}")
    if unreadable_note:
        print(f"{args.db}: {unreadable_note}")
    if args.json:
        write_json(args.json, {"db": args.db, "workloads": rows, "unreadable": unreadable})
    return 0


def _best(args: argparse.Namespace) -> int:
    with open_existing(args.db) as db:
        known = db.workloads()
        keys = sorted({k for k, _, _ in known if k.startswith(args.workload_key)})
        if len(keys) != 1:
            what = "no workload" if not keys else f"{len(keys)} workloads ({', '.join(keys)}) match"
            raise RecordsError(f"{what} {args.workload_key!r} in {args.db}; `tensorgen db stats` lists them")
        key = keys[0]
        targets = [t for k, t, _ in known if k == key]
        if args.target is not None:
            wanted = args.target
            if wanted not in targets:
                raise RecordsError(f"workload {key} has no records for target {wanted!r}; it has: {', '.join(targets)}")
            targets = [wanted]
        out, status = [], 0
        for target in targets:
            found = best_program(db, key, target)
            if found is None:
                errors = db.error_counts(key, target)
                print(f"workload {key} on {target}: no successful measurement "
                      f"({', '.join(f'{k}={n}' for k, n in sorted(errors.items()))})")
                status = 1
                continue
            record, state = found
            program = str(state)
            gflops = _gflops(record)
            print(f"workload {key} on {target}: {record.cost * 1e3:.4f} ms, {gflops:.2f} GFLOP/s "
                  f"({record.compute_dag.flop_count:.4g} FLOP), measured by tensorgen {record.version}")
            print(program)
            out.append({"workload_key": key, "target": target, "cost": record.cost, "gflops": gflops,
                        "flop_count": record.compute_dag.flop_count, "steps": record.steps, "program": program})
        report_unreadable(db)
    if args.json:
        write_json(args.json, out)
    return status


def _export(args: argparse.Namespace) -> int:
    with open_existing(args.db) as db:
        try:
            n = export(db, args.file, args.workload)
        except DatabaseDamagedError as err:  # save what SQLite can still read, row by row
            print(f"{args.db} is damaged ({err.sqlite_error}): exporting the records that can still be read")
            n = write_lines(db.salvage(args.workload), args.file)
        report_unreadable(db)
    print(f"exported {n} record(s) to {args.file}")
    return 0


def _import(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.file):
        raise RecordsError(f"no such file {args.file!r}")
    with SQLiteDatabase(args.db) as db:
        report = import_(db, args.file)
    print(f"{args.file} -> {args.db}: {report}")
    return 0
