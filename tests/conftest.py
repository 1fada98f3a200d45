"""Shared fixtures. `evaluate(outputs, feed) -> list[np.ndarray]` runs a tensor-expression graph,
once with the NumPy interpreter (te_eval) and once compiled from the naive schedule (tensorgen)."""

import numpy as np
import pytest
from te_eval import evaluate as te_evaluate

from tensorgen.build import build
from tensorgen.dag import ComputeDAG
from tensorgen.timing import calibrate


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
    """Compiled kernels go to a cache of this test run so tests never see stale objects; the workers of one run
    (pytest-xdist) share it (entries are written by rename: a reader never sees a partial one), and so compile a
    kernel the other worker compiled only once. $TENSORGEN_CACHE_DIR, where set, wins."""
    import os

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "kernels"
    shared.mkdir(exist_ok=True)
    os.environ.setdefault("TENSORGEN_CACHE_DIR", str(shared))
    # tuning marks the measurements of a busy machine (tuning.busy): a loaded CI machine would mark the tests'
    # and change what they count; tests/test_busy_machine.py turns it on where it is the subject
    os.environ.setdefault("TENSORGEN_BUSY_BOUND", "0")


@pytest.fixture
def slowdown() -> float:
    """How many times slower than quiet this machine is right now (tensorgen.timing.calibrate, >= 1), measured
    as the test starts: a test multiplies its wall-clock limits by it, so that they hold on a busy machine."""
    return calibrate()


@pytest.fixture
def fresh_kernel_cache(tmp_path, monkeypatch):
    """An empty kernel cache of the test's own, and the default compiler (no $CC)."""
    d = tmp_path / "kernels"
    monkeypatch.setenv("TENSORGEN_CACHE_DIR", str(d))
    monkeypatch.delenv("CC", raising=False)
    return d


@pytest.fixture
def quick_timing(monkeypatch):
    """`tensorgen bench` and the other users of tensorgen.timing.Protocol time in two rounds without pauses: for
    tests of what a command reports, not of how steady the timing is."""
    from dataclasses import dataclass

    import tensorgen.timing as timing

    @dataclass(frozen=True)
    class QuickProtocol(timing.Protocol):
        max_rounds: int = 2
        pause_s: float = 0.0
        warm_s: float = 0.0

    monkeypatch.setattr(timing, "Protocol", QuickProtocol)
