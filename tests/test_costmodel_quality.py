"""bench/costmodel_quality.py: collect random programs into a db, evaluate the cost models on held-out programs."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorgen.costmodel.metrics import evaluate_at_ks, metric_names, summarize_folds
from tensorgen.measure.types import ErrorKind, MeasureResult

BENCH = Path(__file__).resolve().parent.parent / "bench" / "costmodel_quality.py"
SMALL = ["--op", "gmm", "--shape", "32,32,32"]  # builds and runs in a fraction of a second per program


@pytest.fixture(scope="module")
def cq():
    spec = importlib.util.spec_from_file_location("costmodel_quality", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("costmodel_quality", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def collected(cq, tmp_path_factory):
    db = tmp_path_factory.mktemp("cq") / "small.db"
    summary = tmp_path_factory.getbasetemp() / "collect.json"
    assert cq.main(["collect", "--n", "24", "--db", str(db), "--batch-size", "12", "--json", str(summary), *SMALL]) == 0
    return db, json.loads(summary.read_text())


def test_collect_measures_n_distinct_programs_and_resumes(cq, collected):
    db, summary = collected
    assert summary["records"] == 24 and summary["measured_now"] == 24
    again = cq.collect(cq.parse_args(["collect", "--n", "24", "--db", str(db), *SMALL]))
    assert again["measured_now"] == 0 and again["records"] == 24  # nothing re-measured
    states, records, info = cq.load_programs(str(db), summary["workload_key"])
    assert len(states) == len(records) == 24 and info["unreplayable"] == 0
    assert len({r.steps_hash for r in records}) == 24
    assert info["collection"]["records"] == 24 and info["collection"]["span_s"] > 0


def test_evaluate_reports_metrics_in_range(cq, collected, tmp_path, capsys):
    db, _ = collected
    out = tmp_path / "report.json"
    argv = ["evaluate", "--db", str(db), "--json", str(out), "--folds", "3", "--k", "3", "5", "--num-rounds", "20",
            "--nthread", "1", *SMALL]  # one XGBoost thread: two spin-wait badly on a busy 2-core machine
    assert cq.main(argv) == 0
    report = json.loads(out.read_text())
    table = capsys.readouterr().out
    names = metric_names((3, 5))
    assert report["programs"] == 24 and report["ok"] + report["failed"] == 24 and report["ok"] > 0
    assert report["metrics"] == names and set(report["models"]) == {"xgb", "random"}
    assert report["features"]["states_per_s"] > 0 and report["features"]["n_features"]
    for model, res in report["models"].items():
        assert model in table
        assert len(res["folds"]) == 3 and sum(f["n_test"] for f in res["folds"]) == 24
        for fold in res["folds"]:
            assert 0.0 <= fold["pairwise_accuracy"] <= 1.0
            assert 0.0 <= fold["recall@3"] <= 1.0 and 0.0 <= fold["recall@5"] <= 1.0
            assert fold["rmse"] >= 0.0
            assert math.isnan(fold["r2"]) or fold["r2"] <= 1.0
        for name in names:
            assert name in res["mean"] and name in res["std"]
    # re-runnable on the same db, deterministic for a fixed seed
    again = cq.evaluate(cq.parse_args(argv[:3] + argv[5:]))  # without --json
    for model in ("xgb", "random"):
        assert again["models"][model]["mean"]["pairwise_accuracy"] == pytest.approx(
            report["models"][model]["mean"]["pairwise_accuracy"])


def synthetic(n: int, seed: int):
    """Programs of 2 statements; throughput is a nonlinear function of the statements' features (plus noise)."""
    rng = np.random.default_rng(seed)
    feats, thr = [], []
    for _ in range(n):
        x = rng.random((2, 12)).astype(np.float32)
        cost = np.exp(2 * x[:, 0]) * (1 + 3 * (x[:, 1] - 0.5) ** 2) + 4 * (x[:, 2] > 0.7) * x[:, 3]
        feats.append(x)
        thr.append(1e9 / cost.sum() * np.exp(rng.normal(0, 0.05)))
    return feats, np.array(thr)


def test_xgb_beats_random_in_cross_validation(cq):
    feats, y = synthetic(400, seed=3)
    y[::25] = 0.0  # a few failed measurements
    cv = cq.cross_validate(feats, y, folds=4, seeds=[0], ks=(10,), models=["xgb", "random"], num_rounds=60,
                           nthread=1)
    xgb_m, rnd_m = cv["xgb"]["mean"], cv["random"]["mean"]
    assert xgb_m["pairwise_accuracy"] > 0.7 and abs(rnd_m["pairwise_accuracy"] - 0.5) < 0.1
    assert xgb_m["recall@10"] > rnd_m["recall@10"] + 0.2
    assert xgb_m["r2"] > 0.15 > rnd_m["r2"] and xgb_m["rmse"] < rnd_m["rmse"]


def test_folds_partition_and_throughput_labels(cq):
    folds = cq.fold_indices(23, 5, seed=1)
    tested = np.concatenate([test for _, test in folds])
    assert sorted(tested.tolist()) == list(range(23))
    for train, test in folds:
        assert np.intersect1d(train, test).size == 0 and train.size + test.size == 23
    assert [t.tolist() for _, t in cq.fold_indices(23, 5, seed=1)] == [t.tolist() for _, t in folds]

    class Rec:  # the two fields throughputs() reads
        def __init__(self, result):
            self.result, self.ok = result, result.ok

    ok = MeasureResult((1.0, 3.0), ErrorKind.NONE)
    failed = MeasureResult((), ErrorKind.RUN_TIMEOUT, "slow")
    assert cq.throughputs([Rec(ok), Rec(failed)], 8.0).tolist() == [4.0, 0.0]  # flop / mean cost


def test_metric_helpers():
    t = np.array([1.0, 2.0, 3.0, 4.0, 0.0])
    m = evaluate_at_ks(t, t / t.max(), ks=(2, 4))  # predictions on the normalized scale
    assert list(m) == ["rmse", "r2", "pairwise_accuracy", "recall@2", "recall@4"]
    assert m["pairwise_accuracy"] == 1.0 and m["recall@2"] == 1.0 and m["recall@4"] == 1.0 and m["r2"] == 1.0
    assert set(metric_names((2, 4))) == set(m)
    s = summarize_folds([{"a": 1.0, "b": float("nan"), "name": "x"}, {"a": 3.0, "b": float("nan")}])
    assert s["mean"]["a"] == 2.0 and s["std"]["a"] == 1.0 and math.isnan(s["mean"]["b"]) and "name" not in s["mean"]
    with pytest.raises(ValueError):
        evaluate_at_ks(t, t, ks=())
