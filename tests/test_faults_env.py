"""Fault injection into the environment (compiler, kernel cache): the real CLI stops with one line before
anything is stored; results that describe the machine rather than the program are measured again on resume."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, save

from tensorgen.codegen.toolchain import preflight
from tensorgen.dag import ComputeDAG
from tensorgen.errors import ToolchainError
from tensorgen.measure import LocalBuilder
from tensorgen.measure.harness import HarnessConfig, harness_executable, run_harness
from tensorgen.measure.runner import classify_run
from tensorgen.measure.types import ErrorKind, MeasureInput
from tensorgen.records import SQLiteDatabase
from tensorgen.search.random_policy import RandomPolicy
from tensorgen.te.ops.suite import make_gmm
from tensorgen.tuning.tune import MeasureConfig, make_task, tune

pytestmark = pytest.mark.serial  # measures with real timeouts: run alone, not beside other tests

ROOT = Path(__file__).resolve().parents[1]
TUNE = ["tune", "gmm", "--shape", "32,32,32", "--trials", "4", "--batch-size", "4", "--policy", "random"]


def cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    for name in [k for k, v in env.items() if v is None]:
        full.pop(name)
    return subprocess.run([sys.executable, "-m", "tensorgen.cli", *args], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def records_in(path: Path) -> int:
    if not path.exists():
        return 0
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]


def assert_one_line_error(proc: subprocess.CompletedProcess, match: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("tensorgen: error: ") and match in errors[0], proc.stderr


@pytest.fixture
def broken(tmp_path: Path) -> dict[str, dict[str, str | None]]:
    """Environments in which no kernel can be built (as root, chmod blocks nothing: a path under a file does)."""
    (tmp_path / "file").write_text("not a directory")
    cache = str(tmp_path / "kernels")
    return {
        "compiler fails": {"CC": "false", "TENSORGEN_CACHE_DIR": cache},
        "no compiler": {"CC": "/nonexistent/cc", "TENSORGEN_CACHE_DIR": cache},
        "cache unwritable": {"TENSORGEN_CACHE_DIR": str(tmp_path / "file" / "sub")},
        "home unwritable": {"HOME": str(tmp_path / "file" / "sub"), "TENSORGEN_CACHE_DIR": None},
    }


MESSAGES = {"compiler fails": "cannot build a trivial kernel", "no compiler": "not found",
            "cache unwritable": "is not writable", "home unwritable": "is not writable"}


@pytest.mark.parametrize("fault", sorted(MESSAGES))
def test_tune_in_a_broken_environment_stops_before_storing(fault, broken, tmp_path: Path) -> None:
    proc = cli([*TUNE, "--db", str(tmp_path / "t.db")], broken[fault], tmp_path)
    assert_one_line_error(proc, MESSAGES[fault])
    assert records_in(tmp_path / "t.db") == 0


def _model(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("fault", ["compiler fails", "cache unwritable"])
def test_build_and_model_tune_in_a_broken_environment(fault, broken, tmp_path: Path) -> None:
    model = _model(tmp_path / "relu.onnx")
    assert_one_line_error(cli(["build", str(model), "-o", str(tmp_path / "out")], broken[fault], tmp_path),
                          MESSAGES[fault])
    assert not (tmp_path / "out" / "model.so").exists()
    proc = cli(["tune", str(model), "--trials", "2", "--db", str(tmp_path / "m.db")], broken[fault], tmp_path)
    assert_one_line_error(proc, MESSAGES[fault])
    assert records_in(tmp_path / "m.db") == 0


def test_a_batch_failing_for_a_full_disk_stops_the_run(tmp_path: Path) -> None:
    """A compiler that builds the trivial preflight kernel but then finds the disk full for every candidate."""
    cc = tmp_path / "fullcc"
    cc.write_text('#!/bin/sh\ncase "$*" in *preflight.c*|--version) exec gcc "$@";; esac\n'
                  'echo "cc1: fatal error: cannot write: No space left on device" >&2\nexit 1\n')
    cc.chmod(0o755)
    proc = cli([*TUNE, "--db", str(tmp_path / "t.db")], {"CC": str(cc), "TENSORGEN_CACHE_DIR": str(tmp_path / "k")},
               tmp_path)
    assert_one_line_error(proc, "every build of the batch failed with 'No space left on device'")
    assert records_in(tmp_path / "t.db") == 0


def test_preflight_rejects_a_bogus_march(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORGEN_CACHE_DIR", str(tmp_path / "k"))
    with pytest.raises(ToolchainError, match="march=bogus.*cannot build a trivial kernel"):
        preflight(march="bogus")
    preflight()


def test_a_cache_lost_mid_run_stops_the_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch 1 builds; then the cache directory becomes a file: every build of batch 2 fails alike, the
    preflight run again finds why, and the builder raises instead of returning failures to be stored."""
    cache = tmp_path / "k"
    monkeypatch.setenv("TENSORGEN_CACHE_DIR", str(cache))
    task = make_task(ComputeDAG(sum(make_gmm(32, 32, 32), [])))
    states = RandomPolicy(task, seed=1).next_batch(4)
    with LocalBuilder(n_parallel=1, timeout=60) as builder:
        assert all(r.error_kind == ErrorKind.NONE for r in builder.build([MeasureInput(task, states[0])]))
        shutil.rmtree(cache)
        cache.write_text("not a directory")
        with pytest.raises(ToolchainError, match="is not writable"):
            builder.build([MeasureInput(task, s) for s in states[1:]])


def test_a_failing_harness_is_not_the_candidates_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORGEN_CACHE_DIR", str(tmp_path / "k"))
    run = run_harness(harness_executable(), str(tmp_path / "missing.so"), "k", ["f:4:i", "f:4:o"], HarnessConfig(),
                      30)
    kind, msg = classify_run(run, 30, 3)
    assert kind == ErrorKind.UNKNOWN and kind.retryable and "dlopen failed" in msg


def test_timeouts_are_measured_again_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed by a 1 ms timeout (as under load) is no verdict on the program: the next run measures
    the same programs first, and keeps their real timings."""
    monkeypatch.setenv("TENSORGEN_CACHE_DIR", str(tmp_path / "k"))
    task = make_task(ComputeDAG(sum(make_gmm(32, 32, 32), [])))
    db = tmp_path / "t.db"
    first = tune(task, trials=3, db=db, policy="random", seed=5, batch_size=3, measure=MeasureConfig(run_timeout=1e-3))
    assert first.errors == {"run_timeout": 3}
    second = tune(task, trials=3, db=db, policy="random", seed=6, batch_size=3)
    assert second.trials == 3 and not second.errors and np.isfinite(second.best_cost)
    records = SQLiteDatabase(db).records(task.workload_key, str(task.target))
    assert len(records) == 6 + second.retimed  # the new best is re-timed
    assert [r.steps_hash for r in records[:3]] == [r.steps_hash for r in records[3:6]]
    third = tune(task, trials=1, db=db, policy="random", seed=7, batch_size=1)  # nothing is measured a third time
    records = SQLiteDatabase(db).records(task.workload_key, str(task.target))
    assert len(records) == 7 + second.retimed + third.retimed and len({r.steps_hash for r in records}) == 4
