"""Training a cost model offline from tuning databases (tuning/training.py, `tensorgen costmodel`).

A database of two small tasks' measured programs is loaded back (every program with its throughput, features under
the hardware it was measured on); the ranking figures are checked with an oracle model (the true throughputs: every
figure perfect) and its reverse; the command trains, saves and evaluates a PaCM and says clearly what is wrong.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from search_tasks import gmm, nrm

from tensorgen.cli.main import main as tensorgen_main
from tensorgen.costmodel.base import RandomModel
from tensorgen.records.database import SQLiteDatabase
from tensorgen.records.record import first_records, program_cost
from tensorgen.tuning.training import load_training_set, ranking_quality
from tensorgen.tuning.tune import tune

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("training") / "two.db"
    for task in (gmm(32), nrm()):
        tune(task, trials=8, policy="random", batch_size=8, db=path)
    return path


class Oracle(RandomModel):
    """Scores programs by a known throughput per feature array (by identity): the perfect ranking, or its reverse."""

    def __init__(self, truth: dict[int, float], sign: float = 1.0) -> None:
        super().__init__(0)
        self.truth, self.sign = truth, sign

    def predict(self, features):
        return np.array([self.sign * self.truth[id(f)] for f in features])


def test_the_databases_programs_come_back_with_their_throughputs(db):
    data = load_training_set([db])
    assert len(data.tasks) == 2 and data.programs == 16 and data.unreplayable == 0
    with SQLiteDatabase(db) as store:
        for task in data.tasks:
            records = first_records(store.records(task.workload_key, task.target))
            want = [task.flop / program_cost([c for c in r.result.costs if c > 0]) if r.ok else 0.0 for r in records]
            np.testing.assert_allclose(task.throughputs, want)
            assert all(f.shape[1] == 164 and f[-1, -1] == -1 for f in task.features)  # the data-flow row last
    feats, y, groups = data.arrays()
    assert len(feats) == len(y) == len(groups) == 16 and len(set(groups)) == 2
    train, held = data.split(0.5)
    assert len(train.tasks) == len(held.tasks) == 1 and {t.group for t in train.tasks + held.tasks} == set(groups)
    first = data.tasks[0].workload_key  # a model's tasks held out: every one of them, whatever the random share
    for share in (0.0, 0.5):
        train, held = data.split(share, workloads={first})
        assert [t.workload_key for t in held.tasks] == [first] and first not in {t.workload_key for t in train.tasks}


def test_ranking_figures_are_perfect_for_an_oracle_and_poor_for_its_reverse(db):
    data = load_training_set([db])
    truth = {id(f): float(y) for t in data.tasks for f, y in zip(t.features, t.throughputs)}
    best = ranking_quality(Oracle(truth), data)
    assert best["pairwise"] == 1.0 and best["top-1"] == 1.0 and best["top-5"] == 1.0 and best["recall@10"] == 1.0
    worst = ranking_quality(Oracle(truth, -1.0), data)
    assert worst["pairwise"] < 0.1 and worst["top-1"] < best["top-1"] and math.isfinite(worst["top-1"])


def test_the_command_trains_saves_and_evaluates_a_model(db, tmp_path, capsys):
    model, figures = tmp_path / "m.pt", tmp_path / "m.json"
    assert tensorgen_main(["costmodel", "train", "--db", str(db), "-o", str(model), "--steps", "20",
                           "--held-out", "0.5", "--json", str(figures)]) == 0
    out = capsys.readouterr().out
    assert "2 tasks, 16 programs" in out and "trained PaCM on 1 tasks" in out and "held out, 1 tasks" in out
    saved = json.loads(figures.read_text())
    assert saved["programs"] == 8 and 0 <= saved["held_out"]["pairwise"] <= 1
    assert tensorgen_main(["costmodel", "eval", f"pacm:{model}", "--db", str(db)]) == 0
    assert "2 tasks: pairwise accuracy" in capsys.readouterr().out
    assert tensorgen_main(["costmodel", "train", "--db", str(db), "-o", str(model), "--steps", "2",
                           "--held-out-model", "dcgan"]) == 0  # none of its tasks in the database: all trained on
    assert "trained PaCM on 2 tasks" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["train", "--db", "missing.db", "-o", "m.pt"], "no database at missing.db"),
    (["train", "--db", "{db}", "-o", "m.pt", "--held-out", "1.5"], "--held-out must be in [0, 1)"),
    (["train", "--db", "{db}", "-o", "m.pt", "--held-out-model", "resnet51"], "'resnet51' is neither a zoo model"),
    # the held-out model is checked before any database is replayed
    (["train", "--db", "missing.db", "-o", "m.pt", "--held-out-model", "resnet51"], "'resnet51' is neither"),
    (["eval", "pacm:missing.pt", "--db", "{db}"], "no model file 'missing.pt'"),
    (["eval", "xgb:{db}", "--db", "{db}"], "not a tensorgen.costmodel.xgb/1 file"),
])
def test_bad_input_is_one_line(db, tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{db}", str(db)) for a in argv]
    try:
        code = tensorgen_main(["costmodel", *argv])
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code != 0 and message in err and "Traceback" not in err
