"""Tuning for a CUDA target end to end on a machine without a GPU: `cuda -emulate=1` builds every candidate
against the CPU emulation of codegen.cuda_emu, so the search (GPU sketches, annotation, cost model, PSA) and the
measurement (device arguments, correctness against the naive CPU program) run for real; only the times say
nothing of a GPU's."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgen import build, te
from tensorgen.errors import TuneError
from tensorgen.records.database import SQLiteDatabase
from tensorgen.runtime.cuda import cuda_available
from tensorgen.te import ops
from tensorgen.tuning.tune import tune

EMULATED = "cuda -emulate=1"


def matmul_relu() -> list[te.Tensor]:
    a, b = te.placeholder((40, 24), name="A"), te.placeholder((24, 36), name="B")
    return [a, b, ops.relu(ops.matmul(a, b, name="C"))]


ON_GPU = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="no GPU")])


@pytest.mark.parametrize("target", [EMULATED, ON_GPU])
def test_a_gpu_search_measures_valid_programs_and_its_best_computes_the_operator(target, tmp_path):
    """Pruner's policy: the GPU analyzer drafts, the cost model verifies over GPU features (the Ansor policy's
    path is the model build's, tests/graph/test_model_build_cuda.py)."""
    db = tmp_path / "gpu.db"
    result = tune(matmul_relu(), trials=8, batch_size=8, target=target, db=db, policy="pruner", seed=1)
    assert result.trials == 8 and not result.errors, result.errors
    assert "threadIdx.x" in str(result.best_state) and "shared" in str(result.best_state)
    f = build(result.best_state, target=target)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((40, 24), dtype=np.float32), rng.standard_normal((24, 36), dtype=np.float32)
    (c,) = f.run(*(a if t.name == "A" else b for t in f.dag.args[:2]))
    np.testing.assert_allclose(c, np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
    with SQLiteDatabase(db) as records:
        saved = records.records(result.task.workload_key)
    assert len(saved) >= 8 and {r.target for r in saved} == {target} and saved[0].hw["extra"]["gpu"] == "h100"


@pytest.mark.skipif(cuda_available(), reason="a GPU is present")
def test_without_a_gpu_a_cuda_search_is_refused_in_one_line():
    with pytest.raises(TuneError, match="no CUDA GPU is usable on this machine; add -emulate=1"):
        tune(matmul_relu(), trials=4, target="cuda -arch=sm_90")
