"""Cost models: pack-sum XGBoost vs random on synthetic programs, the loss gradient, normalization, persistence."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tensorgen.costmodel import (
    CostModel,
    RandomModel,
    XGBModel,
    evaluate,
    normalize_throughput,
    pack_features,
    pairwise_accuracy,
    r2_score,
    recall_at_k,
    rmse,
)
from tensorgen.costmodel.xgb import pack_sum_loss, pack_sum_objective

N_FEATURES = 16


def synthetic(n: int, seed: int, n_features: int = N_FEATURES, tasks: int = 2):
    """Programs of task g have 2 + g statements; a statement's cost is a nonlinear function of 4 of its features.

    Throughput = scale_g / sum of statement costs, with 5% log-normal noise; task scales differ by 1000x so the
    model only works if it normalizes per task.
    """
    rng = np.random.default_rng(seed)
    feats, thr, grp = [], [], []
    for i in range(n):
        g = i % tasks
        x = rng.random((2 + g, n_features)).astype(np.float32)
        cost = np.exp(2 * x[:, 0]) * (1 + 3 * (x[:, 1] - 0.5) ** 2) + 4 * (x[:, 2] > 0.7) * x[:, 3]
        feats.append(x)
        thr.append(10.0 ** (3 * g) / cost.sum() * np.exp(rng.normal(0, 0.05)))
        grp.append(g)
    return feats, np.array(thr), np.array(grp)


@pytest.fixture(scope="module")
def data():
    return synthetic(1500, seed=1), synthetic(600, seed=2)


@pytest.fixture(scope="module")
def trained(data):
    (f, t, g), _ = data
    model = XGBModel(seed=0, nthread=2)
    model.update(f, t, g)
    return model


def test_protocol():
    assert isinstance(RandomModel(0), CostModel)
    assert isinstance(XGBModel(0), CostModel)


def test_xgb_beats_random_on_held_out(trained, data):
    _, (f, t, g) = data
    preds = {"XGB": trained.predict(f), "random": RandomModel(0).predict(f)}
    res = {name: evaluate(t, p, g, k=10) for name, p in preds.items()}
    for name, p in preds.items():  # top-10 within each task: what picking the next measurement batch needs
        res[name]["task_recall@10"] = float(np.mean([recall_at_k(t[g == k], p[g == k], 10) for k in (0, 1)]))
    print(f"\nheld-out ({len(f)} programs, 2 tasks): XGB {res['XGB']}\n  random {res['random']}")
    xgb_m, rnd_m = res["XGB"], res["random"]
    assert xgb_m["pairwise_accuracy"] > 0.8 > 0.6 > rnd_m["pairwise_accuracy"]
    assert xgb_m["recall@10"] >= rnd_m["recall@10"] + 0.2
    assert xgb_m["task_recall@10"] >= rnd_m["task_recall@10"] + 0.2
    assert xgb_m["r2"] > 0.3 > rnd_m["r2"]
    assert xgb_m["rmse"] < rnd_m["rmse"]


def test_pack_sum_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    ids = np.array([0, 0, 2, 2, 2, 3])  # program 1 has no statements
    y = np.array([0.3, 0.0, 1.0, 0.6])
    w = y.copy()
    f = rng.normal(size=ids.size)
    grad, hess = pack_sum_objective(f, ids, y, w)
    eps = 1e-5
    eye = np.eye(f.size) * eps
    num_grad = np.array([(pack_sum_loss(f + e, ids, y, w) - pack_sum_loss(f - e, ids, y, w)) / (2 * eps) for e in eye])
    l0 = pack_sum_loss(f, ids, y, w)
    num_hess = np.array(
        [(pack_sum_loss(f + e, ids, y, w) - 2 * l0 + pack_sum_loss(f - e, ids, y, w)) / eps**2 for e in eye]
    )
    np.testing.assert_allclose(grad, num_grad, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(hess, num_hess, rtol=1e-3, atol=1e-4)
    # the rows of one program share its residual: w_p * (sum f - y_p)
    assert grad[2] == grad[3] == grad[4] == pytest.approx(1.0 * (f[2:5].sum() - 1.0))


def test_normalize_throughput_per_task():
    t = np.array([1.0, 2.0, 1000.0, 4000.0, np.nan, -1.0, 0.0, 0.0])
    g = np.array(["a", "a", "b", "b", "b", "a", "c", "c"])
    np.testing.assert_allclose(normalize_throughput(t, g), [0.5, 1.0, 0.25, 1.0, 0.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(normalize_throughput(t[:4]), [0.00025, 0.0005, 0.25, 1.0])


def test_model_is_invariant_to_per_task_scale(data):
    (f, t, g), (ft, _, _) = data
    a, b = XGBModel(seed=3, num_rounds=30), XGBModel(seed=3, num_rounds=30)
    a.update(f, t, g)
    b.update(f, t * np.where(g == 1, 1e-6, 7.0), g)  # rescale each task differently
    np.testing.assert_allclose(a.predict(ft), b.predict(ft), rtol=1e-5, atol=1e-6)
    assert set(b.task_best_throughput) == {"0", "1"}


def test_random_until_min_samples(data):
    (f, t, g), (ft, _, _) = data
    a, b = XGBModel(seed=5, min_samples=64, num_rounds=20), XGBModel(seed=5, min_samples=64, num_rounds=20)
    for m in (a, b):
        m.update(f[:40], t[:40], g[:40])
    assert not a.trained
    pa = a.predict(ft)
    assert np.array_equal(pa, b.predict(ft)) and np.all((pa >= 0) & (pa < 1))  # seeded
    assert not np.array_equal(pa, XGBModel(seed=6).predict(ft))
    for m in (a, b):
        m.update(f[40:80], t[40:80], g[40:80])  # 80 >= 64: retrained on all 80
    assert a.trained and a.num_samples == 80
    assert np.array_equal(a.predict(ft), b.predict(ft))  # deterministic training


def test_save_load_round_trip(trained, data, tmp_path):
    _, (f, _, _) = data
    path = tmp_path / "xgb.json"
    trained.save(path)
    loaded = XGBModel()
    loaded.load(path)
    assert loaded.trained and loaded.task_best_throughput == trained.task_best_throughput
    assert np.array_equal(loaded.predict(f), trained.predict(f))

    untrained = XGBModel(seed=9, min_samples=10**6)
    untrained.save(tmp_path / "u.json")
    again = XGBModel()
    again.load(tmp_path / "u.json")
    assert not again.trained and again.min_samples == 10**6

    r = RandomModel(4)
    r.save(tmp_path / "r.json")
    r2 = RandomModel(0)
    r2.load(tmp_path / "r.json")
    assert np.array_equal(r2.predict(f), RandomModel(4).predict(f))


def test_empty_programs_and_bad_widths(trained):
    scores = trained.predict([np.zeros((0, N_FEATURES), np.float32), np.ones((2, N_FEATURES), np.float32)])
    assert scores.shape == (2,) and scores[0] == 0.0
    assert trained.predict([]).shape == (0,)
    with pytest.raises(ValueError):
        trained.predict([np.ones((2, N_FEATURES + 1), np.float32)])
    with pytest.raises(ValueError):
        pack_features([np.ones((1, 3)), np.ones((1, 4))])
    with pytest.raises(ValueError):
        XGBModel().update([np.ones((1, 3))], np.ones(2))


def test_metrics():
    y = np.array([0.1, 0.5, 0.9, 0.3])
    assert pairwise_accuracy(y, y) == 1.0
    assert pairwise_accuracy(y, -y) == 0.0
    assert pairwise_accuracy(y, np.zeros(4)) == 0.5  # ties in the prediction count half
    assert pairwise_accuracy([1, 2, 3, 4], [1, 2, 4, 3], groups=[0, 0, 1, 1]) == 0.5  # only within-task pairs
    rng = np.random.default_rng(0)
    a, b = rng.random(300), rng.random(300)
    assert pairwise_accuracy(a, b, chunk=7) == pytest.approx(pairwise_accuracy(a, b))
    assert recall_at_k(np.arange(20), np.arange(20), k=10) == 1.0
    assert recall_at_k(np.arange(20), -np.arange(20), k=10) == 0.0
    assert recall_at_k(np.arange(20), np.r_[np.arange(15), -np.arange(5)], k=10) == 0.5
    assert rmse([0, 1], [0, 0]) == pytest.approx(np.sqrt(0.5))
    assert r2_score(y, y) == 1.0 and r2_score(y, np.full(4, y.mean())) == 0.0


def test_predict_speed(slowdown):
    """10,000 programs x 3 statements x 164 features (the Ansor feature width)."""
    rng = np.random.default_rng(0)
    train = [rng.random((3, 164)).astype(np.float32) for _ in range(500)]
    model = XGBModel(seed=0, num_rounds=100)
    model.update(train, np.array([1.0 / (1.0 + x[:, :4].sum()) for x in train]))
    progs = [rng.random((3, 164)).astype(np.float32) for _ in range(10_000)]
    model.predict(progs[:8])  # warm up
    t0 = time.perf_counter()
    scores = model.predict(progs)
    rate = len(progs) / (time.perf_counter() - t0)
    print(f"\nXGBModel.predict: {rate:,.0f} programs/s (10,000 x 3 x 164, {model.nthread} threads)")
    assert scores.shape == (10_000,) and np.all(np.isfinite(scores))
    assert rate > 10_000 / slowdown
