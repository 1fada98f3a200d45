"""Fault injection into the kernel compile cache: truncated or zeroed cached objects are detected and rebuilt,
never loaded (a crash), copied into a model (a 0-byte model.so) or taken for a failing program."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from tensorgen.codegen.toolchain import compile_source
from tensorgen.graph.backend.build import build_model
from tensorgen.measure.harness import harness_executable
from tensorgen.records.database import SQLiteDatabase
from tensorgen.runtime import ArgSpec, Module
from tensorgen.runtime.model import CompiledModel
from tensorgen.te.ops.suite import make_gmm
from tensorgen.tuning.tune import tune

pytestmark = pytest.mark.serial  # measures with real timeouts: run alone, not beside other tests

SCALE = "void scale(float* restrict x, float* restrict y) { for (int i = 0; i < 64; i++) y[i] = 3.0f * x[i]; }\n"


@pytest.fixture(autouse=True)
def cache(fresh_kernel_cache: Path) -> Path:
    return fresh_kernel_cache


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


@pytest.mark.parametrize("corrupt", [truncate, zero])
def test_a_corrupt_cached_kernel_is_rebuilt(corrupt, caplog: pytest.LogCaptureFixture) -> None:
    path = compile_source(SCALE)
    good = path.read_bytes()
    corrupt(path)
    assert path.read_bytes() != good
    assert compile_source(SCALE) == path
    assert path.read_bytes() == good
    assert "does not match its checksum" in caplog.text
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    Module(path).kernel("scale", [ArgSpec("x", (64,), "float32"), ArgSpec("y", (64,), "float32")])(x, y)
    np.testing.assert_array_equal(y, 3 * x)


def test_a_cached_kernel_without_its_checksum_is_rebuilt(caplog: pytest.LogCaptureFixture) -> None:
    path = compile_source(SCALE)
    path.with_name(path.name + ".sum").unlink()
    zero(path)
    compile_source(SCALE)
    assert "has no checksum" in caplog.text
    Module(path).kernel("scale", [ArgSpec("x", (64,), "float32"), ArgSpec("y", (64,), "float32")])


def test_a_corrupt_timing_harness_is_rebuilt() -> None:
    exe = harness_executable()
    truncate(exe)
    assert harness_executable() == exe
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3 and "harness: usage" in proc.stderr


def _tiny_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], np.linspace(-1, 1, 32).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("corrupt", [truncate, zero])
def test_a_model_built_over_a_corrupt_cache_runs(corrupt, cache: Path, tmp_path: Path) -> None:
    proto = _tiny_model()
    build_model(proto, tmp_path / "first")
    for so in cache.glob("*.so"):
        corrupt(so)
    out = build_model(proto, tmp_path / "second")
    assert (out / "model.so").read_bytes() == (tmp_path / "first" / "model.so").read_bytes()
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    (y,) = CompiledModel(out, threads=1).run([x])
    np.testing.assert_allclose(y, np.maximum(x @ np.linspace(-1, 1, 32).astype(np.float32).reshape(8, 4), 0),
                               rtol=1e-5, atol=1e-6)


def test_tuning_over_a_truncated_cache_measures_the_programs(cache: Path, tmp_path: Path) -> None:
    inputs, outputs = make_gmm(16, 16, 16)
    first = tune(inputs + outputs, trials=4, db=tmp_path / "first.db", policy="random", seed=3, batch_size=4)
    assert first.trials == 4 and not first.errors
    for path in cache.iterdir():
        if path.suffix == ".so" or path.name.startswith("harness-") and path.suffix != ".sum":
            truncate(path)
    second = tune(inputs + outputs, trials=4, db=tmp_path / "second.db", policy="random", seed=3, batch_size=4)
    assert second.trials == 4 and not second.errors
    db = SQLiteDatabase(tmp_path / "second.db")
    assert all(r.ok for r in db)
