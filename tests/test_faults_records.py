"""Faults in the tuning database, injected into real SQLite files and met through the real `tensorgen` entry point:
corrupt rows (skipped with one warning per kind, the good records still used by stats, best, export, tune and
build), a read-only database (refused before anything is measured), a full disk (one line, every committed
record kept) and a `--db` naming a missing file."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorgen import te
from tensorgen.cli import main
from tensorgen.measure.types import ErrorKind, MeasureResult
from tensorgen.records import Record, SQLiteDatabase
from tensorgen.schedule import State
from tensorgen.target import HardwareParams, Target
from tensorgen.task import SearchTask

ROOT = Path(__file__).resolve().parents[1]
TARGET = "cpu -cores=2 -mcpu=x86-64"


def gmm_task(n: int) -> SearchTask:
    a, b = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    k = te.reduce_axis(n, "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return SearchTask(State([a, b, c]).dag, Target.parse(TARGET), HardwareParams(cores=2))


def tiled(task: SearchTask, factor: int) -> State:
    s = State(task.dag)
    s.split("C", "i", [factor])
    return s


def cli(argv: list[str]) -> int:
    """tensorgen.cli.main as the console script runs it (argparse errors exit through SystemExit)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def run_cli(argv: list[str], cwd: Path, preexec_fn=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real `tensorgen` command in its own process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "tensorgen.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=preexec_fn)


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr


# ---------------------------------------------------------------------------------------------
# a corrupt row, one kind at a time: db stats, db best, db export


A, B = gmm_task(16), gmm_task(8)
A_COSTS = {1: 4e-3, 2: 1e-3, 3: 2e-3}  # row id -> cost; row 2 is A's best, row 4 a failure, rows 5-6 are B's


@pytest.fixture
def records_db(tmp_path) -> Path:
    path = tmp_path / "tuning.db"
    with SQLiteDatabase(path) as db:
        for factor, cost in zip((2, 4, 8), A_COSTS.values()):
            db.commit_record(Record.from_measure(A, tiled(A, factor), MeasureResult((cost,))))
        db.commit_record(Record.from_measure(A, tiled(A, 16), MeasureResult((), ErrorKind.COMPILE_ERROR, "x")))
        for factor, cost in ((2, 3e-4), (4, 5e-4)):
            db.commit_record(Record.from_measure(B, tiled(B, factor), MeasureResult((cost,))))
    return path


def corrupt(path: Path, sql: str, *args) -> None:
    """Damage the file as something other than tensorgen would: plain SQL on the real file."""
    conn = sqlite3.connect(path)
    conn.execute(sql, args)
    conn.commit()
    conn.close()


ROW_FAULTS = {  # kind -> SQL damaging A's best record (row 2)
    "steps not JSON": ("UPDATE records SET steps = '[[\"SP\", 2' WHERE id = 2", "invalid JSON"),
    "hw not JSON": ("UPDATE records SET hw = '{' WHERE id = 2", "invalid JSON"),
    "result not JSON": ("UPDATE records SET result = 'nan,' WHERE id = 2", "invalid JSON"),
    "steps not UTF-8": ("UPDATE records SET steps = CAST(x'5b5b22ff5d5d' AS TEXT) WHERE id = 2", "not UTF-8"),
    "key not UTF-8": ("UPDATE records SET workload_key = CAST(x'ff00ff' AS TEXT) WHERE id = 2", "not UTF-8"),
    "newer format": ("UPDATE records SET format = 99 WHERE id = 2", "newer format"),
    "format not a number": ("UPDATE records SET format = 'one' WHERE id = 2", "malformed"),
    "unknown step": ("UPDATE records SET steps = '[[\"NOPE\", 1]]' WHERE id = 2", "malformed"),
    "step of wrong arity": ("UPDATE records SET steps = '[[\"SP\"]]' WHERE id = 2", "malformed"),
    "result without costs": ("UPDATE records SET result = '{\"error_kind\": \"none\"}' WHERE id = 2", "malformed"),
}


def warnings_about(caplog, needle: str = "skipping record") -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and needle in r.getMessage()]


@pytest.mark.parametrize("fault", sorted(ROW_FAULTS))
def test_corrupt_row_is_skipped_by_stats_best_and_export(fault, records_db, tmp_path, capsys, caplog):
    sql, kind = ROW_FAULTS[fault]
    corrupt(records_db, sql)
    db = str(records_db)

    assert cli(["db", "stats", "--db", db, "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert f"1 unreadable record(s) skipped ({kind}: 1)" in out
    (warning,) = warnings_about(caplog)
    assert "record 2" in warning and db in warning
    stats = json.loads((tmp_path / "s.json").read_text())
    by_key = {w["workload_key"]: w for w in stats["workloads"]}
    assert (by_key[A.workload_key]["records"], by_key[A.workload_key]["best_cost"]) == (3, 2e-3)
    assert (by_key[B.workload_key]["records"], by_key[B.workload_key]["best_cost"]) == (2, 3e-4)
    assert stats["unreadable"] == {kind: 1}

    caplog.clear()
    assert cli(["db", "best", A.workload_key, "--db", db, "--json", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "b.json").read_text())[0]["cost"] == 2e-3  # the next fastest
    assert len(warnings_about(caplog)) == 1

    caplog.clear()
    assert cli(["db", "export", str(tmp_path / "out.jsonl"), "--db", db]) == 0
    assert "exported 5 record(s)" in capsys.readouterr().out
    assert len(warnings_about(caplog)) == 1
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 5


@pytest.mark.parametrize("dag_sql", [
    "UPDATE workloads SET dag = '{\"format\": 1}' WHERE workload_key = ?",  # JSON, but not a DAG
    "UPDATE workloads SET dag = '{\"format\": 1, \"tensors\"' WHERE workload_key = ?",  # truncated
    "UPDATE workloads SET dag = CAST(x'7bff7d' AS TEXT) WHERE workload_key = ?",  # not UTF-8
    "DELETE FROM workloads WHERE workload_key = ?",  # no DAG at all (a join would drop the records in silence)
])
def test_workload_with_a_broken_dag_is_skipped_and_the_others_are_kept(dag_sql, records_db, tmp_path, capsys,
                                                                       caplog):
    corrupt(records_db, dag_sql, A.workload_key)
    assert cli(["db", "stats", "--db", str(records_db), "--json", str(tmp_path / "s.json")]) == 0
    assert "4 unreadable record(s) skipped (bad DAG: 4)" in capsys.readouterr().out
    (warning,) = warnings_about(caplog)  # one warning for the four rows
    assert "record 1" in warning and "DAG" in warning
    stats = json.loads((tmp_path / "s.json").read_text())
    by_key = {w["workload_key"]: w for w in stats["workloads"]}
    assert by_key[A.workload_key]["records"] == 0 and by_key[A.workload_key]["best_cost"] is None
    assert by_key[B.workload_key]["best_cost"] == 3e-4
    assert cli(["db", "best", B.workload_key, "--db", str(records_db)]) == 0


def test_next_commit_repairs_a_broken_workload_dag(records_db):
    corrupt(records_db, "UPDATE workloads SET dag = '{' WHERE workload_key = ?", A.workload_key)
    with SQLiteDatabase(records_db) as db:
        assert db.best(A.workload_key, TARGET) is None and len(db.corrupt) == 3  # the successful rows
        db.commit_record(Record.from_measure(A, tiled(A, 1), MeasureResult((9e-3,))))
    with SQLiteDatabase(records_db, readonly=True) as db:  # the old records are readable again, with the new one
        assert len(db.records(A.workload_key, TARGET)) == 5 and not db.corrupt
        assert db.best(A.workload_key, TARGET).cost == 1e-3


def test_steps_that_do_not_replay_are_skipped_by_db_best(records_db, tmp_path, caplog):
    corrupt(records_db, "UPDATE records SET steps = '[[\"SP\", 0, \"nope\", [2], true]]' WHERE id = 2")
    assert cli(["db", "best", A.workload_key, "--db", str(records_db), "--json", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "b.json").read_text())[0]["cost"] == 2e-3
    assert len(warnings_about(caplog, "do not replay")) == 1


# ---------------------------------------------------------------------------------------------
# tune (resume) and build, in their own processes


@pytest.mark.serial  # counts what a tuning run measured: alone, where no candidate times out for another's load
def test_tune_resumes_past_corrupt_records(tmp_path):
    argv = ["tune", "gmm", "--shape", "16,16,16", "--policy", "random", "--db", "t.db"]
    first = run_cli([*argv, "--trials", "4", "--batch-size", "4"], tmp_path)
    assert first.returncode == 0, first.stderr
    with sqlite3.connect(tmp_path / "t.db") as conn:  # a re-timed best has more records than one
        readable = conn.execute("SELECT COUNT(DISTINCT steps_hash) FROM records WHERE id > 2").fetchone()[0]
        before = conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]
    corrupt(tmp_path / "t.db", "UPDATE records SET steps = '{' WHERE id = 1")
    corrupt(tmp_path / "t.db", "UPDATE records SET format = 7 WHERE id = 2")
    again = run_cli([*argv, "--trials", "2", "--batch-size", "2", "--json", "again.json"], tmp_path)
    assert again.returncode == 0, again.stderr
    no_traceback(again)
    warned = [line for line in again.stderr.splitlines() if "skipping record" in line]
    assert len(warned) == 2 and "record 1" in warned[0] and "record 2" in warned[1], again.stderr
    assert f"2 this run, {readable + 2} in the database" in again.stdout  # the readable old ones were resumed
    retimed = json.loads((tmp_path / "again.json").read_text())["retimed"]
    with SQLiteDatabase(tmp_path / "t.db", readonly=True) as db:
        assert len(db) == before + 2 + retimed


def tiny_model(path: Path) -> Path:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)).astype("float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


def test_build_uses_the_next_record_past_a_corrupt_best(tmp_path):
    tiny_model(tmp_path / "tiny.onnx")
    tuned = run_cli(["tune", "tiny.onnx", "--trials", "4", "--policy", "random", "--db", "t.db"], tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert re.search(r"4 trials in [\d.]+ s \(budget\): search [\d.]+ s, build [\d.]+ s, run [\d.]+ s", tuned.stdout)
    with SQLiteDatabase(tmp_path / "t.db", readonly=True) as db:
        (key, target, _), = db.workloads()
        best, second = db.top_k(key, target, 2)  # the two fastest programs (a re-timed one has several records)
    with sqlite3.connect(tmp_path / "t.db") as conn:
        ids = [i for (i,) in conn.execute("SELECT id FROM records WHERE steps_hash = ?", (best.steps_hash,))]
    for best_id in ids:
        corrupt(tmp_path / "t.db", "UPDATE records SET result = '[' WHERE id = ?", best_id)
    built = run_cli(["build", "tiny.onnx", "-o", "out", "--db", "t.db", "--candidates", "1"], tmp_path)
    assert built.returncode == 0, built.stderr
    no_traceback(built)
    # only the record standing for the best program is read (see Database.ranked), found unreadable, skipped
    assert any(f"skipping record {i}:" in built.stderr for i in ids) and "1 unreadable record(s)" in built.stdout
    (kernel,) = json.loads((tmp_path / "out" / "model.json").read_text())["kernels"]
    assert kernel["schedule"] == "tuned" and kernel["cost"] == second.cost


# ---------------------------------------------------------------------------------------------
# --db naming a missing file


@pytest.mark.parametrize("command", [["build", "tiny.onnx", "-o", "out"], ["bench", "tiny.onnx"]])
def test_missing_db_is_an_error_for_build_and_bench(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny_model(tmp_path / "tiny.onnx")
    assert cli([*command, "--db", "tunnig.db"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("tensorgen: error:") and "'tunnig.db' does not exist" in line
    assert not (tmp_path / "tunnig.db").exists() and not (tmp_path / "out").exists()


def test_build_without_db_says_it_builds_untuned(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny_model(tmp_path / "tiny.onnx")
    assert cli(["build", "tiny.onnx", "-o", "out"]) == 0
    assert "no tuning database" in capsys.readouterr().out
    (kernel,) = json.loads((tmp_path / "out" / "model.json").read_text())["kernels"]
    assert kernel["schedule"] == "default"


# ---------------------------------------------------------------------------------------------
# a read-only database, a full disk


def _mount_tmpfs(directory: Path, size: str) -> bool:
    directory.mkdir(exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                          capture_output=True).returncode == 0


def _umount(directory: Path) -> None:
    subprocess.run(["umount", "-l", str(directory)], capture_output=True)


@contextmanager
def read_only(directory: Path, files: list[Path]) -> Iterator[None]:
    """Make `directory` (and the database files in it) read-only for this user, as the OS really enforces it:
    chmod for an ordinary user; for root, whom chmod does not stop, a read-only tmpfs mount of a copy."""
    if os.geteuid() != 0:
        for f in files:
            f.chmod(0o444)
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    saved = directory.with_name(directory.name + ".saved")
    shutil.copytree(directory, saved)
    if not _mount_tmpfs(directory, "4m"):
        shutil.rmtree(saved)
        pytest.skip("running as root, where chmod does not stop writes, and mount(8) is not permitted: "
                    "this OS gives no way to make a file read-only for this user")
    try:
        shutil.copytree(saved, directory, dirs_exist_ok=True)
        assert subprocess.run(["mount", "-o", "remount,ro", str(directory)]).returncode == 0
        yield
    finally:
        _umount(directory)


def test_tune_refuses_a_read_only_database_before_measuring(records_db, tmp_path):
    directory = records_db.parent / "ro"
    directory.mkdir()
    path = directory / "tuning.db"
    shutil.move(records_db, path)
    with read_only(directory, [path]):
        proc = run_cli(["tune", "gmm", "--shape", "16,16,16", "--trials", "4", "--policy", "random", "--db",
                        str(path)], tmp_path)
        assert proc.returncode == 2, proc.stderr
        no_traceback(proc)
        (line,) = proc.stderr.splitlines()  # no progress line: nothing was measured
        assert line.startswith(f"tensorgen: error: cannot write to tuning database '{path}'"), line
        readers = run_cli(["db", "stats", "--db", str(path)], tmp_path)  # reading needs no write access
        assert readers.returncode == 0 and "6 record(s)" in readers.stdout, readers.stderr


def test_tune_refuses_a_new_database_in_a_read_only_directory(tmp_path):
    directory = tmp_path / "ro"
    directory.mkdir()
    with read_only(directory, []):
        proc = run_cli(["tune", "gmm", "--shape", "16,16,16", "--trials", "4", "--db", str(directory / "new.db")],
                       tmp_path)
        assert proc.returncode == 2
        no_traceback(proc)
        (line,) = proc.stderr.splitlines()
        assert line.startswith("tensorgen: error: cannot write to tuning database") and "not writable" in line


def _limit_file_size(limit: int):
    def preexec() -> None:  # in the child: writes past `limit` bytes fail with EFBIG instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.serial  # counts what a tuning run measured: alone, where no candidate times out for another's load
@pytest.mark.parametrize("how", ["tmpfs", "rlimit"])
def test_full_disk_during_tuning_is_one_line_and_keeps_what_was_committed(how, tmp_path):
    directory = tmp_path / "small"
    preexec = None
    if how == "tmpfs":
        if not _mount_tmpfs(directory, "160k"):
            pytest.skip("mount(8) is not permitted here; the rlimit case fills a size-limited file instead")
    else:
        directory.mkdir()
        preexec = _limit_file_size(160 * 1024)
    try:
        proc = run_cli(["tune", "gmm", "--shape", "16,16,16", "--trials", "200", "--batch-size", "2", "--policy",
                        "random", "--db", str(directory / "t.db")], tmp_path, preexec_fn=preexec)
        assert proc.returncode == 2, proc.stderr[-2000:]
        no_traceback(proc)
        last = proc.stderr.splitlines()[-1]
        assert last.startswith(f"tensorgen: error: cannot store records in tuning database '{directory / 't.db'}'")
        assert last.endswith("every record committed before is kept")
        reported = [int(line.split("] ")[1].split("/")[0]) for line in proc.stderr.splitlines()
                    if line.startswith("[tune")]
        done = reported[-1] if reported else 0  # the disk filled up before the budget was spent
        assert done < 200
        with SQLiteDatabase(directory / "t.db", readonly=True) as db:
            records = list(db)
            assert len(records) >= done and not db.corrupt  # every committed record, all readable
            assert all(r.steps for r in records if r.ok)
    finally:
        if how == "tmpfs":
            _umount(directory)
