"""In-model selection: each kernel's program among its task's best few records, by its time in the model."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tensorgen.graph.backend import select
from tensorgen.graph.backend.build import build_model
from tensorgen.graph.backend.tasks import extract_tasks
from tensorgen.graph.load import load_graph
from tensorgen.graph.reference.compare import onnxruntime_runner
from tensorgen.records.database import SQLiteDatabase
from tensorgen.runtime.model import CompiledModel


def _two_layer_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])
    rng = np.random.default_rng(0)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [32, 64], rng.standard_normal(32 * 64).astype(np.float32))
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [64, 16], rng.standard_normal(64 * 16).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "two_layers", [x], [y], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _fake_times(monkeypatch, times_by_ranks):
    """kernel_times answers from a table keyed by the ranks the directory was built with."""
    built = {}

    def build(ranks, directory):
        built[directory] = tuple(ranks)
        return directory

    monkeypatch.setattr(select, "kernel_times",
                        lambda dirs, threads, runs, rounds: np.array([times_by_ranks[built[d]] for d in dirs]))
    return build


def test_each_kernel_takes_its_fastest_rank_when_the_mix_is_faster(monkeypatch):
    build = _fake_times(monkeypatch, {(0, 0): [1.0, 5.0], (1, 1): [3.0, 2.0], (0, 1): [1.1, 2.1]})
    chosen = select.select_in_model(build, kernels=2, candidates=2)
    assert chosen.ranks == [0, 1] and chosen.mixed
    assert chosen.rank_ms.sum(axis=1) == pytest.approx([6.0, 5.0])
    assert chosen.mixed_ms.sum(axis=1) == pytest.approx([5.0, 3.2])  # rank 1 (the best alone) against the mix


def test_the_best_single_rank_is_kept_when_the_mix_is_slower(monkeypatch):
    # mixing changed what each kernel's neighbour finds in the caches: the mix loses as a whole
    build = _fake_times(monkeypatch, {(0, 0): [1.0, 5.0], (1, 1): [3.0, 2.0], (0, 1): [2.0, 3.5]})
    chosen = select.select_in_model(build, kernels=2, candidates=2)
    assert chosen.ranks == [1, 1] and not chosen.mixed


def test_in_model_selection_builds_with_the_chosen_records(tmp_path):
    from tensorgen.tuning.tune import tune

    proto = _two_layer_model()
    db = SQLiteDatabase(tmp_path / "t.db")
    keys = []
    for t in extract_tasks(load_graph(proto)):
        tune(t.task, trials=4, db=db, policy="random", seed=1)
        keys.append(t.task.workload_key)
    messages: list[str] = []
    directory = build_model(proto, tmp_path / "out", db=db, candidates=3, progress=messages.append)
    kernels = json.loads((directory / "model.json").read_text())["kernels"]
    assert all(k["tuned"] and 0 <= k["rank"] < 3 for k in kernels)
    for k in kernels:  # the record used is the task's rank-th candidate
        chosen = select.candidate_records(db, k["workload_key"], "cpu", k["rank"] + 1)[k["rank"]]
        assert k["cost"] == chosen.result.median_cost
    assert sum("in-model selection" in m for m in messages) == 2  # the ranks' times, then the verdict
    graph = load_graph(proto)
    x = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    ours = CompiledModel(directory, threads=2).run([x])
    np.testing.assert_allclose(ours[0], onnxruntime_runner(proto, graph, 2)([x])[0], rtol=1e-4, atol=1e-4)


def test_no_selection_where_no_task_has_two_records(tmp_path):
    """A database with at most one record per task offers nothing to choose: the model is built once, not
    candidates + 1 more times the same (each such build held the weights again)."""
    from tensorgen.tuning.tune import tune

    proto = _two_layer_model()
    db = SQLiteDatabase(tmp_path / "t.db")
    messages: list[str] = []
    build_model(proto, tmp_path / "empty", db=db, candidates=4, progress=messages.append)
    task = extract_tasks(load_graph(proto))[0].task
    tune(task, trials=1, db=db, policy="random", seed=1)
    build_model(proto, tmp_path / "one", db=db, candidates=4, progress=messages.append)
    assert messages and not any("in-model selection" in m for m in messages), messages


def test_zero_candidates_is_a_one_line_cli_error(tmp_path, capsys):
    from tensorgen.cli import main as cli

    with pytest.raises(SystemExit) as exit_:
        cli(["build", "resnet18", "--candidates", "0", "-o", str(tmp_path / "out")])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("tensorgen: error: argument --candidates: must be a positive integer")


def test_ranks_past_a_tasks_records_use_its_slowest(tmp_path):
    from tensorgen.tuning.tune import tune

    proto = _two_layer_model()
    db = SQLiteDatabase(tmp_path / "t.db")
    for t in extract_tasks(load_graph(proto)):
        tune(t.task, trials=2, db=db, policy="random", seed=1)
    directory = build_model(proto, tmp_path / "out", db=db, ranks=[5, 5])
    kernels = json.loads((directory / "model.json").read_text())["kernels"]
    for k in kernels:
        top = db.top_k(k["workload_key"], "cpu", 10)
        assert len(top) == 2 and k["rank"] == 5 and k["cost"] == top[-1].result.median_cost


def test_candidates_put_each_thread_partition_first_then_the_rest_by_speed(tmp_path):
    from search_tasks import gmm

    from tensorgen.tuning.tune import tune

    task = gmm(64)
    db = SQLiteDatabase(tmp_path / "t.db")
    tune(task, trials=24, db=db, policy="random", seed=0)
    key = task.workload_key
    top = db.top_k(key, "cpu", 100)
    signatures = [select.partition_signature(r.state()) for r in top]
    distinct = len(set(signatures))
    assert 1 < distinct < len(top)  # the test needs both kinds
    picked = select.candidate_records(db, key, "cpu", len(top))
    assert sorted(r.steps_hash for r in picked) == sorted(r.steps_hash for r in top)
    firsts = [select.partition_signature(r.state()) for r in picked[:distinct]]
    assert len(set(firsts)) == distinct  # one per partition, each its fastest
    assert [r.steps_hash for r in picked[:distinct]] == [r.steps_hash for r, s in zip(top, signatures)
                                                          if signatures.index(s) == top.index(r)]
    rest = picked[distinct:]
    assert [r.result.median_cost for r in rest] == sorted(r.result.median_cost for r in rest)
    assert picked[0].steps_hash == top[0].steps_hash
