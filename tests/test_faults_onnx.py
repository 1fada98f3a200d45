"""Malformed, truncated and adversarial ONNX files through the real CLI (`bench`, `build`, `tune`) in a process
limited to 4 GB of address space: each ends in one named line and exit status 2, quickly, never a traceback."""

from __future__ import annotations

import os
import resource
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_faults import FAULTS

from tensorgen.errors import MemoryBudgetError
from tensorgen.graph.ir import GraphError
from tensorgen.graph.load import load_graph

ROOT = Path(__file__).resolve().parents[1]
ADDRESS_SPACE = 4 << 30
TIMEOUT = 120  # seconds; each file takes a few, most of it importing tensorgen


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "TENSORGEN_CACHE_DIR": str(cwd / "kernels"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "tensorgen.cli", *args], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=TIMEOUT, preexec_fn=_limit)


def command(name: str, model: Path, tmp: Path) -> list[str]:
    return {"bench": ["bench", str(model), "--blocks", "1", "--candidates", "1"],
            "build": ["build", str(model), "-o", str(tmp / "out")],
            "tune": ["tune", str(model), "--trials", "2", "--db", str(tmp / "t.db")]}[name]


def assert_named_error(proc: subprocess.CompletedProcess, fragment: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("tensorgen: error: ") and fragment in lines[0], lines[0]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_bench_of_a_bad_onnx_file_is_one_named_error(fault, tmp_path: Path, slowdown: float) -> None:
    write, fragment = FAULTS[fault]
    start = time.perf_counter()
    proc = cli(command("bench", write(tmp_path / f"{fault}.onnx"), tmp_path), tmp_path)
    assert_named_error(proc, fragment)
    assert time.perf_counter() - start < 60 * slowdown


@pytest.mark.parametrize("cmd", ["build", "tune"])
@pytest.mark.parametrize("fault", ["huge_matmul", "huge_constant_of_shape", "cycle", "external_outside", "truncated",
                                   "duplicate_outputs"])
def test_build_and_tune_of_a_bad_onnx_file_are_one_named_error(fault, cmd, tmp_path: Path) -> None:
    write, fragment = FAULTS[fault]
    assert_named_error(cli(command(cmd, write(tmp_path / f"{fault}.onnx"), tmp_path), tmp_path), fragment)
    assert not (tmp_path / "out" / "model.so").exists()


def test_the_memory_budget_is_stated_with_its_figures(tmp_path: Path) -> None:
    model = FAULTS["huge_relu"][0](tmp_path / "relu.onnx")
    proc = cli(command("bench", model, tmp_path), tmp_path, {"TENSORGEN_MEMORY_LIMIT": "12G"})
    assert_named_error(proc, "model 'fault' needs 80.0 GB for its weights, inputs, outputs and buffers; "
                             "the limit is 12.9 GB")
    proc = cli(command("bench", model, tmp_path), tmp_path, {"TENSORGEN_MEMORY_LIMIT": "lots"})
    assert_named_error(proc, "TENSORGEN_MEMORY_LIMIT='lots' is not a size")


def _add_model(shape: list[int]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    w = helper.make_tensor("w", TensorProto.FLOAT, shape, np.arange(np.prod(shape), dtype=np.float32).tobytes(),
                           raw=True)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "add", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_model_within_the_budget_loads_and_one_over_it_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _add_model([64, 64])  # 3 x 16 KB
    monkeypatch.setenv("TENSORGEN_MEMORY_LIMIT", "48K")
    assert load_graph(model).inputs == ["x"]
    monkeypatch.setenv("TENSORGEN_MEMORY_LIMIT", "47K")
    with pytest.raises(MemoryBudgetError, match="needs 49.2 KB .*the limit is 48.1 KB"):
        load_graph(model)


def test_external_data_inside_the_folder_loads(tmp_path: Path) -> None:
    model = _add_model([32, 32])
    onnx.save_model(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.weights", size_threshold=0)
    assert (tmp_path / "m.weights").stat().st_size == 4096
    graph = load_graph(tmp_path / "m.onnx")
    np.testing.assert_array_equal(graph.constants["w"].ravel(), np.arange(1024, dtype=np.float32))


def test_external_data_shorter_than_declared_is_refused(tmp_path: Path) -> None:
    onnx.save_model(_add_model([32, 32]), tmp_path / "m.onnx", save_as_external_data=True, location="m.weights",
                    size_threshold=0)
    data = (tmp_path / "m.weights").read_bytes()
    (tmp_path / "m.weights").write_bytes(data[:100])
    with pytest.raises(GraphError, match="the file holds 100 bytes and the tensor needs 4096"):
        load_graph(tmp_path / "m.onnx")


ALIGN_HUGE = """
import time
from tensorgen import te
from tensorgen.dag import ComputeDAG
from tensorgen.graph.backend.align import align_partitions
from tensorgen.schedule import State
from tensorgen.schedule.lower import lower

def kernel(name, src, dst):
    a = te.placeholder((100000, 100000), name=src)
    b = te.compute((100000, 100000), lambda i, j: a[i, j] * 2.0, name=dst)
    s = State(ComputeDAG(b))
    s.fuse(dst, ["i", "j"])
    s.parallel(dst, "i_j_f")
    return lower(s, name)

funcs = [kernel("k0", "A", "B"), kernel("k1", "B", "C")]
start = time.perf_counter()
out = align_partitions(funcs, [["a", "b"], ["b", "c"]], threads=2)
print(out == funcs, time.perf_counter() - start)
"""


def test_partition_alignment_of_huge_kernels_is_bounded(tmp_path: Path) -> None:
    """A [100000, 100000] kernel pair: analysed per element, 10 GB; skipped, at once."""
    proc = subprocess.run([sys.executable, "-c", ALIGN_HUGE], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=_limit)
    assert proc.returncode == 0, proc.stderr
    same, seconds = proc.stdout.split()
    assert same == "True" and float(seconds) < 10


def test_tuning_an_operator_too_large_for_memory_stores_nothing(tmp_path: Path) -> None:
    """Sizes of a suite operator are checked too, before its arguments are allocated for timing."""
    proc = cli(["tune", "gmm", "--shape", "100000,100000,100000", "--trials", "2", "--batch-size", "2", "--policy",
                "random", "--db", str(tmp_path / "t.db")], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("tensorgen: error: GMM(100000,100000,100000) needs 120.0 GB")
    with sqlite3.connect(tmp_path / "t.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM records").fetchone() == (0,)
