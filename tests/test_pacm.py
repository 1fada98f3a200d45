"""Pruner's pattern-aware cost model (costmodel/pacm.py), its data-flow features (features/dataflow.py) and
momentum transfer learning.

The data-flow tokens are checked against tiles counted by hand on a known GEMM schedule; the model must learn an
independent ranking (the static analyzer's order of random programs) from its features, with either branch alone;
LambdaRank must prefer the right order; a saved model loads as the pretrained Siamese copy, predicts at once and
moves by momentum every `momentum_every` updates; tuning with it finds a program that computes what NumPy does.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from search_tasks import c2d_relu, gmm, make_task
from test_psa import HW, gmm_program

pytest.importorskip("torch")
import torch  # noqa: E402

from tensorgen.build import build  # noqa: E402
from tensorgen.costmodel.base import CostModelError  # noqa: E402
from tensorgen.costmodel.metrics import pairwise_accuracy  # noqa: E402
from tensorgen.costmodel.pacm import PaCM, PaCMConfig, lambda_rank_loss  # noqa: E402
from tensorgen.costmodel.psa import StaticAnalyzer  # noqa: E402
from tensorgen.features.dataflow import TOKEN_FIELDS, WORKLOAD_FIELDS, split_dataflow  # noqa: E402
from tensorgen.features.extractor import FeatureExtractor  # noqa: E402
from tensorgen.search.sketch_policy import SketchPolicy  # noqa: E402
from tensorgen.te import ops  # noqa: E402
from tensorgen.te.tensor import placeholder  # noqa: E402
from tensorgen.tuning.tune import make_cost_model, tune  # noqa: E402

FIELD = {name: k for k, name in enumerate(TOKEN_FIELDS)}


def test_tokens_describe_the_tiles_of_a_known_gemm():
    """C = A @ B, 256^3, register tile 4 x 64 inside the reduction loop k_1 (test_psa.gmm_program)."""
    rows = FeatureExtractor(HW, dataflow=True).extract([gmm_program()])[0]
    plain = FeatureExtractor(HW).extract([gmm_program()])[0]
    stmts, workload, tokens = split_dataflow(rows)
    np.testing.assert_array_equal(stmts, plain)  # the statement rows are untouched, one row more
    assert workload[WORKLOAD_FIELDS.index("has_pattern")] == 1
    assert workload[WORKLOAD_FIELDS.index("main_flops")] == pytest.approx(np.log2(1 + 2 * 256**3))
    register = tokens.reshape(3, 3, -1)[2]  # level 3; the store C_local first, then the reads A and B
    elements = [2 ** register[j, FIELD["tile_elements"]] - 1 for j in range(3)]
    assert elements[0] == pytest.approx(4 * 64) and sorted(elements[1:]) == pytest.approx([4, 64])
    assert register[0, FIELD["write"]] == 1 and register[1, FIELD["write"]] == 0
    assert register[0, FIELD["intermediate"]] == 1 and register[1:, FIELD["intermediate"]].sum() == 0  # args A, B
    assert register[:, FIELD["level.register_tile"]].tolist() == [1, 1, 1]
    assert register[:, FIELD["vector_fill"]].tolist() == [1, 1, 1]  # j_2 (64) fills 16-lane vectors
    assert tokens.reshape(3, 3, -1)[0, :, FIELD["level.l2_tile"]].tolist() == [1, 1, 1]


def test_a_program_without_a_reduction_has_no_tokens():
    x = placeholder((64, 64), name="X")
    task = make_task([x], [ops.relu(x)])
    states = SketchPolicy.from_options(task, workers=1).evolution.sample(5)
    _, workload, tokens = split_dataflow(FeatureExtractor(task.hw, dataflow=True).extract(states)[0])
    assert workload[WORKLOAD_FIELDS.index("has_pattern")] == 0 and not tokens.any()
    assert workload[WORKLOAD_FIELDS.index("argument_bytes")] > 0
    _, _, none = split_dataflow(np.zeros((0, 164)))
    assert not none.any()


def test_lambda_rank_prefers_the_right_order():
    labels = torch.tensor([1.0, 0.5, 0.1, 0.0])
    right, wrong = torch.tensor([3.0, 2.0, 1.0, 0.0]), torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert lambda_rank_loss(right, labels) < lambda_rank_loss(wrong, labels)
    assert float(lambda_rank_loss(wrong, torch.zeros(4))) == 0.0  # nothing to rank


def _programs(task, n):
    states = SketchPolicy.from_options(task, workers=1).evolution.sample(n)
    return FeatureExtractor(task.hw, dataflow=True).extract(states), 1.0 / StaticAnalyzer(task.hw).latencies(states)


@pytest.mark.parametrize("branches", [{}, {"dataflow": False}, {"statements": False}])
def test_pacm_learns_an_independent_ranking_with_either_branch(branches):
    feats, y = _programs(c2d_relu(), 500)
    model = PaCM(seed=0, config=PaCMConfig(steps=150, min_samples=32, **branches))
    assert not model.trained
    model.update(feats[:350], y[:350], np.zeros(350))
    assert model.trained
    assert pairwise_accuracy(y[350:], model.predict(feats[350:])) > 0.7


def test_a_saved_model_is_the_pretrained_copy_and_moves_by_momentum(tmp_path):
    feats, y = _programs(gmm(), 200)
    teacher = PaCM(seed=1, config=PaCMConfig(steps=40, min_samples=16))
    teacher.update(feats[:150], y[:150], np.zeros(150))
    teacher.save(tmp_path / "m.pt")
    student = make_cost_model(f"pacm:{tmp_path / 'm.pt'}", seed=2)
    assert student.trained and student.dataflow  # warm: predicts before any measurement of its own
    np.testing.assert_allclose(student.predict(feats[150:]), teacher.predict(feats[150:]), rtol=1e-5)
    start = [p.detach().clone() for p in student.siamese.parameters()]
    for k in range(4):
        student.update(feats[150 + 10 * k:160 + 10 * k], y[150 + 10 * k:160 + 10 * k], np.zeros(10))
        moved = any(not torch.equal(a, b) for a, b in zip(start, student.siamese.parameters()))
        assert moved == (k == 3)  # the copy moves every 4 updates
    target = list(student.net.parameters())
    for a, b, t in zip(start, student.siamese.parameters(), target):  # 0.99 copy + 0.01 target
        torch.testing.assert_close(b, 0.99 * a + 0.01 * t.detach(), rtol=1e-5, atol=1e-6)


def test_a_loaded_model_keeps_its_shape_from_the_file_and_trains_by_its_own_config(tmp_path):
    feats, y = _programs(gmm(), 60)
    teacher = PaCM(seed=1, config=PaCMConfig(hidden=32, steps=10, min_samples=16))
    teacher.update(feats[:40], y[:40], np.zeros(40))
    teacher.save(tmp_path / "m.pt")
    still = PaCM(seed=2, path=tmp_path / "m.pt", config=PaCMConfig(transfer_steps=3, transfer_lr=0.0))
    assert still.config.hidden == 32 and still.config.transfer_steps == 3
    before = still.predict(feats[40:])
    still.update(feats[40:], y[40:], np.zeros(20))  # fine-tuning at learning rate 0 leaves the network as loaded
    np.testing.assert_allclose(still.predict(feats[40:]), before, rtol=1e-6)
    moving = PaCM(seed=2, path=tmp_path / "m.pt", config=PaCMConfig(transfer_steps=3, transfer_lr=1e-2))
    moving.update(feats[40:], y[40:], np.zeros(20))
    assert not np.allclose(moving.predict(feats[40:]), before)


def test_bad_model_files_say_so(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_text("not a model")
    with pytest.raises(CostModelError, match="not a PaCM model file"):
        make_cost_model(f"pacm:{bad}")
    run = subprocess.run([sys.executable, "-m", "tensorgen.cli", "tune", "gmm", "--shape", "16,16,16", "--trials", "1",
                          "--cost-model", f"pacm:{tmp_path / 'missing.pt'}"], capture_output=True, text=True)
    assert run.returncode != 0 and "no model file" in run.stderr and "Traceback" not in run.stderr


def test_tuning_with_pacm_finds_a_correct_program(tmp_path):
    model = PaCM(config=PaCMConfig(min_samples=16, steps=20))
    result = tune(gmm(32), trials=32, cost_model=model, batch_size=16,
                  policy_options={"population": 64, "generations": 2, "workers": 1})
    assert result.trials == 32 and result.best_state is not None and model.trained and model.updates == 2
    rng = np.random.default_rng(0)
    a, b = (rng.random((1, 32, 32), dtype=np.float32) for _ in range(2))
    (c,) = build(result.best_state).run(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
