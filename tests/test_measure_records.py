"""End to end: measure candidates in isolation, keep every result in SQLite, reuse the best through the CLI."""

import json

import numpy as np

from tensorgen import State, build, te
from tensorgen.cli import main
from tensorgen.dag import ComputeDAG
from tensorgen.measure import ErrorKind, LocalBuilder, LocalRunner, MeasureInput
from tensorgen.records import Record, SQLiteDatabase, apply_best
from tensorgen.target import HardwareParams, Target
from tensorgen.task import SearchTask


def _matmul_task() -> SearchTask:
    a, b = te.placeholder((64, 32), name="A"), te.placeholder((32, 48), name="B")
    k = te.reduce_axis(32, "k")
    c = te.compute((64, 48), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return SearchTask(ComputeDAG([a, b, c]), Target.parse("cpu"), HardwareParams(cores=2))


def _candidates(task: SearchTask) -> list[State]:
    naive = State(task.dag)
    tiled = State(task.dag)
    tiled.split("C", "i", [8]).split("C", "j", [16]).reorder("C", ["i_0", "j_0", "k", "i_1", "j_1"])
    tiled.parallel("C", "i_0").vectorize("C", "j_1")
    unfilled = State(task.dag).split("C", "i", [None])
    return [naive, tiled, unfilled]


def test_measured_records_survive_and_the_best_is_reused(tmp_path):
    task = _matmul_task()
    inputs = [MeasureInput(task, s) for s in _candidates(task)]
    with LocalBuilder(n_parallel=2) as builder:
        results = LocalRunner(check_correctness=True).run(inputs, builder.build(inputs))
    assert [r.error_kind for r in results] == [ErrorKind.NONE, ErrorKind.NONE, ErrorKind.INSTANTIATION]

    path = tmp_path / "tuning.db"
    with SQLiteDatabase(path) as db:
        for inp, res in zip(inputs, results):
            db.commit_record(Record.from_measure(task, inp.state, res))
    with SQLiteDatabase(path) as db:  # reopened: nothing lost
        assert len(db) == 3
        best = db.best(task.workload_key, str(task.target))
        assert best.cost == min(r.median_cost for r in results)
        state = apply_best(task.dag, task.target, db)
    a, b = np.random.rand(64, 32).astype("float32"), np.random.rand(32, 48).astype("float32")
    (c,) = build(state).run(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)

    stats_file = tmp_path / "stats.json"
    assert main(["db", "stats", "--db", str(path), "--json", str(stats_file)]) == 0
    assert task.workload_key in stats_file.read_text()
    export_file = tmp_path / "records.jsonl"
    assert main(["db", "export", str(export_file), "--db", str(path)]) == 0
    assert main(["db", "import", str(export_file), "--db", str(tmp_path / "copy.db")]) == 0
    with SQLiteDatabase(tmp_path / "copy.db") as copy:
        assert len(copy) == 3
        assert json.loads(copy.best(task.workload_key, "cpu").steps_json) == json.loads(best.steps_json)
