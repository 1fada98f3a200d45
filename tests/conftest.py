"""Shared fixtures. `evaluate(outputs, feed) -> list[np.ndarray]` runs a tensor-expression graph,
once with the NumPy interpreter (te_eval) and once compiled from the naive schedule (tensorgen)."""

import numpy as np
import pytest
from te_eval import evaluate as te_evaluate

from tensorgen.build import build
from tensorgen.dag import ComputeDAG


def compiled_evaluate(outputs, feed):
    """Lower the naive State (no steps) to C, compile, run."""
    dag = ComputeDAG(list(feed) + list(outputs))
    by_name = {t.name: a for t, a in feed.items()}
    inputs = [np.ascontiguousarray(by_name[t.name]) for t in dag.inputs]
    return build(dag).run(*inputs)[: len(outputs)]


EVALUATORS = {"te_eval": te_evaluate, "compiled": compiled_evaluate}


@pytest.fixture(params=sorted(EVALUATORS))
def evaluate(request):
    return EVALUATORS[request.param]


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache(tmp_path_factory):
    """Compiled kernels go to a per-session cache so tests never see stale objects."""
    import os

    os.environ.setdefault("TENSORGEN_CACHE_DIR", str(tmp_path_factory.mktemp("kernels")))


@pytest.fixture
def fresh_kernel_cache(tmp_path, monkeypatch):
    """An empty kernel cache of the test's own, and the default compiler (no $CC)."""
    d = tmp_path / "kernels"
    monkeypatch.setenv("TENSORGEN_CACHE_DIR", str(d))
    monkeypatch.delenv("CC", raising=False)
    return d
