"""Tuning records: round trips, best/top-k, concurrent writers, crash durability, JSONL, apply_best, CLI."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import sqlite3
import time

import numpy as np
import pytest

from tensorgen import te
from tensorgen.build import build
from tensorgen.cli import main as cli
from tensorgen.measure.types import ErrorKind, MeasureResult
from tensorgen.records import (
    RECORD_FORMAT,
    Database,
    Record,
    RecordFormatError,
    RecordsError,
    SQLiteDatabase,
    apply_best,
    export,
    import_,
)
from tensorgen.schedule import State
from tensorgen.target import HardwareParams, Target
from tensorgen.task import SearchTask

TARGET = "cpu -mcpu=x86-64 -cores=2"


def matmul_tensors(n: int = 24, m: int = 16, k: int = 20):
    a, b = te.placeholder((n, k), name="A"), te.placeholder((k, m), name="B")
    kk = te.reduce_axis(k, "k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, kk] * b[kk, j], axis=kk), name="C")
    return [a, b, c]


def make_task(target: str = TARGET) -> SearchTask:
    return SearchTask(State(matmul_tensors()).dag, Target.parse(target), HardwareParams(cores=2, peak_gflops=100.0))


def tiled(task: SearchTask, factor: int) -> State:
    s = State(task.dag)
    s.split("C", "i", [factor])
    s.parallel("C", "i_0")
    return s


def ok(*costs: float) -> MeasureResult:
    return MeasureResult(tuple(costs), all_cost=0.5)


def failed(kind: ErrorKind, msg: str = "it broke") -> MeasureResult:
    return MeasureResult((), kind, msg, all_cost=0.1)


@pytest.fixture
def task() -> SearchTask:
    return make_task()


@pytest.fixture
def db():
    with SQLiteDatabase.in_memory() as d:
        yield d


# ---------------------------------------------------------------------------------------------
# records


def test_record_round_trip(task):
    s = tiled(task, 4)
    rec = Record.from_measure(task, s, MeasureResult((3e-3, 1e-3, 2e-3, 4e-3), all_cost=1.25, timestamp=123.5))
    again = Record.from_json_line(rec.to_json_line())
    assert again == rec
    assert again.format == RECORD_FORMAT and again.version == rec.version
    assert again.cost == pytest.approx(2.5e-3)  # median of four
    assert again.state() == s and again.state().to_json() == s.to_json()
    t = again.task()
    assert t.workload_key == task.workload_key and str(t.target) == str(task.target) and t.hw == task.hw
    assert json.loads(rec.to_json_line())["format"] == RECORD_FORMAT

    err = Record.from_measure(task, s, MeasureResult((float("inf"),), ErrorKind.RUN_TIMEOUT, "slow", float("inf")))
    err_again = Record.from_json_line(err.to_json_line())  # strict JSON: inf travels as a string
    assert err_again.cost == float("inf") and err_again.error_kind == "run_timeout"
    assert err_again.result.costs == (float("inf"),) and err_again.result.all_cost == float("inf")


def test_record_rejects_foreign_state(task):
    other = State(matmul_tensors(8, 8, 8))
    with pytest.raises(RecordsError, match="workload"):
        Record.from_measure(task, other, ok(1.0))


def test_best_and_top_k_with_errors(task, db):
    assert isinstance(db, Database)
    assert db.best(task.workload_key, TARGET) is None
    plan = [(2, ok(5e-3)), (3, failed(ErrorKind.COMPILE_ERROR)), (4, ok(2e-3, 2e-3, 9.0)),
            (6, failed(ErrorKind.RUN_TIMEOUT)), (8, ok(1e-3)), (12, failed(ErrorKind.COMPILE_ERROR)), (24, ok(3e-3))]
    for factor, result in plan:
        db.commit_record(Record.from_measure(task, tiled(task, factor), result))
    other = make_task("cpu -cores=4")
    db.commit_record(Record.from_measure(other, tiled(other, 2), ok(1e-6)))  # faster, but another target

    best = db.best(task.workload_key, TARGET)
    assert best is not None and best.cost == 1e-3 and best.state() == tiled(task, 8)
    assert [r.cost for r in db.top_k(task.workload_key, TARGET, 3)] == [1e-3, 2e-3, 3e-3]
    assert len(db.top_k(task.workload_key, TARGET, 100)) == 4  # failures never rank
    assert db.best(task.workload_key, "cpu -cores=2 -mcpu=x86-64") == best  # option order does not matter
    assert [r.error_kind for r in db.records(task.workload_key, TARGET)] == [
        "none", "compile_error", "none", "run_timeout", "none", "compile_error", "none"]
    assert len(db.records(task.workload_key)) == 8 and len(db) == 8
    assert db.workloads() == [(task.workload_key, "cpu -cores=2 -mcpu=x86-64", 7),
                              (task.workload_key, "cpu -cores=4", 1)]
    assert db.error_counts(task.workload_key, TARGET) == {"none": 4, "compile_error": 2, "run_timeout": 1}
    assert db.has_state(task.workload_key, TARGET, tiled(task, 6).to_json())
    assert db.has_state(task.workload_key, TARGET, json.loads(tiled(task, 6).to_json()))
    assert not db.has_state(task.workload_key, TARGET, tiled(task, 5).to_json())
    assert not db.has_state(task.workload_key, "cpu -cores=4", tiled(task, 6).to_json())
    # best() is an indexed range query, not a scan
    plan_rows = db._conn.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM records WHERE workload_key = ? AND target = ? AND cost IS NOT NULL "
        "ORDER BY cost LIMIT 1", (task.workload_key, TARGET)).fetchall()
    assert "records_by_cost" in str(plan_rows)


def test_top_k_ranks_programs_by_their_measurements(task, db):
    """A re-timed program costs the upper median of its measurements: one lucky run does not make it best."""
    for factor, cost in [(2, 1e-4), (2, 3e-3), (2, 3e-3), (4, 2e-3), (8, 4e-3), (8, 1e-4)]:
        db.commit_record(Record.from_measure(task, tiled(task, factor), ok(cost)))
    top = db.top_k(task.workload_key, TARGET, 5)
    assert [(r.cost, r.state()) for r in top] == [(2e-3, tiled(task, 4)), (3e-3, tiled(task, 2)),
                                                  (4e-3, tiled(task, 8))]
    assert db.best(task.workload_key, TARGET).state() == tiled(task, 4)


# ---------------------------------------------------------------------------------------------
# durability and concurrency (real processes; spawn so no SQLite state is inherited)


def _writer(path: str, line: str, tag: int, n: int, start, committed) -> None:
    template = Record.from_json_line(line)
    db = SQLiteDatabase(path)
    start.wait()
    for i in range(n):
        db.commit_record(dataclasses.replace(template, result=ok(tag + i * 1e-6)))
        if committed is not None:
            committed.value = i + 1
    if committed is not None:  # the test kills us here, mid-run, without closing anything
        time.sleep(600)
    db.close()


def test_two_processes_write_concurrently(task, tmp_path):
    path = str(tmp_path / "tuning.db")
    line = Record.from_measure(task, tiled(task, 4), ok(1.0)).to_json_line()
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)  # both writers have the file open before either commits
    procs = [ctx.Process(target=_writer, args=(path, line, tag, 200, start, None)) for tag in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with SQLiteDatabase(path) as db:
        assert len(db) == 400
        costs = sorted(r.cost for r in db.records(task.workload_key))
        assert sum(c < 2 for c in costs) == 200 and sum(c >= 2 for c in costs) == 200
        assert db.best(task.workload_key, TARGET).cost == costs[200]  # one program: the upper median of its costs


def test_sigkill_loses_nothing_committed(task, tmp_path, slowdown):
    path = str(tmp_path / "tuning.db")
    line = Record.from_measure(task, tiled(task, 4), ok(1.0)).to_json_line()
    ctx = multiprocessing.get_context("spawn")
    start, committed = ctx.Barrier(1), ctx.Value("i", 0)  # keep both alive until the child has them
    proc = ctx.Process(target=_writer, args=(path, line, 1, 50, start, committed))
    proc.start()
    deadline = time.time() + 60 * slowdown
    while committed.value < 50 and time.time() < deadline and proc.is_alive():
        time.sleep(0.01)
    assert committed.value == 50
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    with SQLiteDatabase(path) as db:
        assert len(db) == 50
        assert all(r.state() == tiled(task, 4) for r in db.records(task.workload_key))


def test_newer_database_schema_is_refused(tmp_path):
    path = tmp_path / "tuning.db"
    SQLiteDatabase(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(RecordFormatError, match="schema version 99"):
        SQLiteDatabase(path)


# ---------------------------------------------------------------------------------------------
# JSON lines


def _fill(db: SQLiteDatabase, task: SearchTask) -> None:
    for factor, result in [(2, ok(4e-3)), (3, failed(ErrorKind.WRONG_ANSWER)), (4, ok(1e-3)), (8, ok(2e-3))]:
        db.commit_record(Record.from_measure(task, tiled(task, factor), result))


def test_jsonl_export_import(task, db, tmp_path):
    _fill(db, task)
    path = tmp_path / "records.jsonl"
    assert export(db, path) == 4
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(x)["format"] == RECORD_FORMAT for x in lines)
    assert export(db, tmp_path / "none.jsonl", workload_key="nope") == 0

    with SQLiteDatabase.in_memory() as fresh:
        report = import_(fresh, path)
        assert (report.imported, report.skipped) == (4, [])
        assert [r.to_dict() for r in fresh.records(task.workload_key)] == [
            r.to_dict() for r in db.records(task.workload_key)]
        assert fresh.best(task.workload_key, TARGET).cost == 1e-3
        again = import_(fresh, path)  # importing twice adds nothing
        assert again.imported == 0 and [n for n, _ in again.skipped] == [1, 2, 3, 4]
        assert "duplicate" in again.skipped[0][1] and len(fresh) == 4


def test_jsonl_newer_format_fails_whole_import(task, db, tmp_path):
    _fill(db, task)
    path = tmp_path / "records.jsonl"
    export(db, path)
    lines = path.read_text().splitlines()
    newer = json.loads(lines[2])
    newer["format"] = RECORD_FORMAT + 1
    lines[2] = json.dumps(newer)
    path.write_text("\n".join(lines) + "\n")
    with SQLiteDatabase.in_memory() as fresh:
        with pytest.raises(RecordFormatError, match=r"line 3: record format version 2 is newer .*format 1"):
            import_(fresh, path)
        assert len(fresh) == 0


def test_jsonl_corrupt_lines_are_skipped_with_line_numbers(task, db, tmp_path):
    _fill(db, task)
    path = tmp_path / "records.jsonl"
    export(db, path)
    lines = path.read_text().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]  # truncated write
    no_steps = json.loads(lines[2])
    del no_steps["steps"]
    lines[2] = json.dumps(no_steps)
    wrong_key = json.loads(lines[3])
    wrong_key["workload_key"] = "0" * 24
    lines.insert(3, "")  # blank lines are fine
    lines.append(json.dumps(wrong_key))
    path.write_text("\n".join(lines) + "\n")
    with SQLiteDatabase.in_memory() as fresh:
        report = import_(fresh, path)
        assert report.imported == 2
        assert [n for n, _ in report.skipped] == [2, 3, 6]
        reasons = dict(report.skipped)
        assert "JSON" in reasons[2] and "steps" in reasons[3] and "workload key" in reasons[6]
        assert "line 2" in str(report)


# ---------------------------------------------------------------------------------------------
# apply_best


def test_apply_best_builds_and_matches_numpy(task, db, tmp_path):
    assert apply_best(task.dag, TARGET, db) is None
    _fill(db, task)
    db.commit_record(Record.from_measure(task, tiled(task, 6), failed(ErrorKind.RUNTIME_ERROR)))
    path = tmp_path / "records.jsonl"
    export(db, path)

    a_t, b_t, c_t = matmul_tensors()  # rebuilt by the caller's code: new Tensor objects, same workload
    with SQLiteDatabase.in_memory() as fresh:  # only the exported file travels
        import_(fresh, path)
        state = apply_best(State([a_t, b_t, c_t]).dag, Target.parse(TARGET), fresh)
    assert state is not None and state.to_json() == tiled(task, 4).to_json()
    assert state.dag.tensors[-1] is c_t
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, a_t.shape).astype("float32")
    b = rng.uniform(-1, 1, b_t.shape).astype("float32")
    (c,) = build(state).run(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    assert apply_best(task.dag, "cpu -cores=64", db) is None


# ---------------------------------------------------------------------------------------------
# command line


def _error(capsys, argv: list[str]) -> str:
    """The one line `tensorgen` prints for an error, checked to be that and exit code 2."""
    assert cli(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("tensorgen: error:")
    return line


def test_cli(task, tmp_path, capsys):
    path = str(tmp_path / "tuning.db")
    with SQLiteDatabase(path) as db:
        _fill(db, task)
        db.commit_record(Record.from_measure(task, tiled(task, 5), failed(ErrorKind.COMPILE_ERROR)))

    assert cli(["db", "stats", "--db", path, "--json", str(tmp_path / "stats.json")]) == 0
    out = capsys.readouterr().out
    assert task.workload_key in out and "compile_error=1" in out and "wrong_answer=1" in out
    stats = json.loads((tmp_path / "stats.json").read_text())["workloads"][0]
    assert (stats["records"], stats["ok"], stats["best_cost"]) == (5, 3, 1e-3)
    assert stats["best_gflops"] == pytest.approx(task.dag.flop_count / 1e-3 / 1e9)

    assert cli(["db", "best", task.workload_key[:8], "--db", path, "--json", str(tmp_path / "best.json")]) == 0
    out = capsys.readouterr().out
    assert "s.split('C', 'i', [4])" in out and "1.0000 ms" in out and "GFLOP/s" in out
    best = json.loads((tmp_path / "best.json").read_text())[0]
    assert best["cost"] == 1e-3 and best["target"] == "cpu -cores=2 -mcpu=x86-64"
    assert "no records for target" in _error(capsys, ["db", "best", task.workload_key, "--db", path, "--target",
                                                      "cpu -cores=3"])
    assert "no workload" in _error(capsys, ["db", "best", "ffff", "--db", path])

    jsonl, copy = str(tmp_path / "out.jsonl"), str(tmp_path / "copy.db")
    assert cli(["db", "export", jsonl, "--db", path, "--workload", task.workload_key]) == 0
    assert "exported 5 record(s)" in capsys.readouterr().out
    assert cli(["db", "import", jsonl, "--db", copy]) == 0
    assert "imported 5 record(s), skipped 0" in capsys.readouterr().out
    assert cli(["db", "import", jsonl, "--db", copy]) == 0
    assert "imported 0 record(s), skipped 5" in capsys.readouterr().out

    missing = str(tmp_path / "missing.db")
    for argv in (["db", "stats", "--db", missing], ["db", "best", "abc", "--db", missing],
                 ["db", "export", jsonl, "--db", missing]):
        assert "does not exist" in _error(capsys, argv)
    assert not os.path.exists(missing)
    (tmp_path / "junk.db").write_text("not a database at all " * 100)
    assert "cannot open" in _error(capsys, ["db", "stats", "--db", str(tmp_path / "junk.db")])
