"""The hand schedules of tensorgen.examples (used by bench/hand_schedules.py) on small shapes, and the scripts
bench/hand_schedules.py and bench/tune_gmm.py on tiny budgets."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorgen.build import build
from tensorgen.examples import conv2d_nhwc_im2col, conv2d_nhwc_reference, conv2d_state, gmm_state, max_rel_error

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))  # the bench scripts import tensorgen/timing.py
from tensorgen import timing  # noqa: E402


@pytest.mark.parametrize("m,n,k,kw", [
    (64, 64, 64, {}),  # the bench's schedule: 8x8 register tile, k_block=min(256, k)
    (32, 64, 48, {"n_blocks": 2, "k_block": 16, "j_outer": True}),  # column blocks, a real k_0 loop
    (16, 16, 24, {"n_blocks": 1, "k_block": 8}),
])
def test_gmm_schedule(m, n, k, kw):
    state = gmm_state(m, n, k, **kw)
    func = build(state)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    (c,) = func.run(a, b)
    assert max_rel_error(c, a @ b) < 1e-4
    assert "C_local" in func.source and "#pragma omp parallel" in func.source


@pytest.mark.parametrize("kw", [
    {},  # packed weights, 8 w x 8 co register tile
    {"pack_weight": False},  # ops.conv2d as is
    {"tile_w": 4, "tile_co": 16},  # two vectors of output channels
    {"tile_w": 2, "padding": 0},  # no pad stage
    {"stride": 2, "tile_w": 4},
    {"tile_h": 2, "tile_w": 4, "co_outer": True},
])
def test_conv2d_schedule(kw):
    n, h, w, ci, co = 1, 8, 8, 16, 16
    padding, stride = kw.get("padding", 1), kw.get("stride", 1)
    state = conv2d_state(n, h, w, ci, co, kernel=3, **kw)
    func = build(state)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, h, w, ci), dtype=np.float32)
    wt = rng.standard_normal((3, 3, ci, co), dtype=np.float32)
    (y,) = func.run(x, wt)
    ref = conv2d_nhwc_reference(x, wt, padding=padding, stride=stride)
    assert y.shape == ref.shape
    assert max_rel_error(y, ref) < 1e-4
    assert max_rel_error(conv2d_nhwc_im2col(x, wt, padding, stride), ref) < 1e-4


def test_bad_tiles_are_rejected():
    with pytest.raises(ValueError):
        gmm_state(60, 64, 64)
    with pytest.raises(ValueError):
        conv2d_state(1, 8, 8, 16, 12)



def _bench_module(name: str):
    """bench/<name>.py as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hand_schedules_bench_uses_the_timing_protocol():
    """One statistic per row: the ratio is the ratio of the reported GFLOP/s; NumPy writes into its own
    preallocated output."""
    hand = _bench_module("hand_schedules")
    protocol = timing.Protocol(rounds=2, max_rounds=2, bound=1000.0, samples=2, pause_s=0.0, warm_s=0.0)
    res = hand.bench_gmm(protocol, False, 1, size=64)
    assert res["max_rel_error"] < hand.RTOL and res["reliable"] is True
    assert res["ratio"] == pytest.approx(res["tensorgen_gflops"] / res["numpy_gflops"])
    assert res["timing"]["rounds"] == 2 and set(res["timing"]["seconds"]) == {"tensorgen", "numpy"}


def test_tune_gmm_bench_smoke(tmp_path, capsys):
    tune_gmm = _bench_module("tune_gmm")
    out = tmp_path / "g.json"
    assert tune_gmm.main(["--size", "32", "--trials", "2", "--batch-size", "2", "--rounds", "2", "--max-rounds", "2",
                          "--repeat", "2", "--pause", "0", "--bound", "1000", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["ratio"] == pytest.approx(data["tuned_gflops"] / data["numpy_gflops"]) and data["reliable"]
    assert "rounds" in capsys.readouterr().out


def test_dataset_bench_measures_random_then_searched_programs_and_resumes(tmp_path, capsys):
    from tensorgen.tuning.training import load_training_set

    dataset = _bench_module("dataset")
    db = tmp_path / "d.db"
    argv = ["--models", "dcgan", "--programs", "2", "--db", str(db), "--minutes", "0"]
    assert dataset.main(argv) == 0  # one task, then the time is up
    out = capsys.readouterr().out
    data = load_training_set([db], min_programs=1)
    assert len(data.tasks) == 1 and data.tasks[0].target == "cpu" and 1 <= data.programs <= 2  # a small space
    assert f"[1/7] dcgan: transpose (0.0 MFLOP): {data.programs} programs" in out
    assert "stopped after 0.0 minutes, 1 of 7" in out
    assert dataset.main(argv) == 0 and load_training_set([db], min_programs=1).programs == data.programs  # resumed


def test_pruner_quality_bench_tables(tmp_path):
    """Both tables from two small databases of random programs: the cost models on a task they were not trained on,
    and PSA's pruned space (whose Best-1 can only be at most 1: the space's best over a subset's best)."""
    from search_tasks import gmm, nrm

    from tensorgen.tuning.tune import tune

    train, test = tmp_path / "train.db", tmp_path / "test.db"
    tune(gmm(16), trials=12, policy="random", batch_size=12, db=train)
    tune(nrm(), trials=16, policy="random", batch_size=16, db=test)
    quality = _bench_module("pruner_quality")
    out = tmp_path / "models.json"
    assert quality.main(["models", "--train-db", str(train), "--test-db", str(test), "--online", "8", "--steps", "10",
                         "--workdir", str(tmp_path), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["test_tasks"] == 1 and report["train_tasks"] == 1 and len(report["models"]) == 6
    assert all(0 <= m["pairwise"] <= 1 and 0 < m["top-5"] <= 1 for m in report["models"].values())
    out = tmp_path / "psa.json"
    assert quality.main(["psa", "--db", str(test), "--db", str(train), "--sizes", "3,6", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["tasks"] == 2 and set(report["best_k"]) == {"size 3", "size 6"}
    assert all(0 < v <= 1 for size in report["best_k"].values() for v in size.values())


def test_pruner_networks_time_to_reach_ansor():
    networks = _bench_module("pruner_networks")
    curve = [(1.0, 16, 9.0), (2.0, 32, 5.0), (3.5, 48, 4.0)]
    assert networks.time_to_reach(curve, 5.0) == (2.0, 32) and networks.time_to_reach(curve, 3.9) is None
    with pytest.raises(SystemExit, match="need ansor"):
        networks.main(["--variants", "pruner"])
    with pytest.raises(SystemExit, match="has no run of bert_tiny"):
        networks.main(["--models", "bert_tiny", "--variants", "pruner", "--baseline",
                       str(Path(networks.__file__).parent / "results" / "pruner_networks_s25.json")])
