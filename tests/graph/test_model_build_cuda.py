"""Whole models built for CUDA (`build_model(..., target="cuda ...")`) and run through CompiledModel: under
`cuda -emulate=1` every kernel runs on this CPU's emulation of the GPU (codegen.cuda_emu) with the tensors in the
emulation's device memory, so the executor (weights and inputs copied in, outputs copied out, index checks on the
host) is checked against ONNX Runtime here; nvcc compiles a built model where it is installed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from fuzz_graph_check import check_model, compare, feeds
from fuzz_graphs import random_model
from onnx import TensorProto, helper

from tensorgen.cli import main as cli
from tensorgen.errors import RuntimeCallError, TensorgenError
from tensorgen.graph.backend.build import build_model
from tensorgen.graph.backend.tasks import extract_tasks
from tensorgen.graph.load import load_graph
from tensorgen.records.database import SQLiteDatabase
from tensorgen.runtime.cuda import cuda_available
from tensorgen.runtime.model import CompiledModel
from tensorgen.schedule.gpu_bind import bind_unbound
from tensorgen.schedule.state import State
from tensorgen.tuning.scheduler import SchedulerConfig, TaskScheduler

EMULATED = "cuda -emulate=1"
RNG = np.random.default_rng(0)


def _model(nodes: list, inputs: dict[str, tuple[int, list[int]]], consts: dict[str, np.ndarray],
           outputs: list[str]) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    inits = [onnx.numpy_helper.from_array(v, n) for n, v in consts.items()]
    graph = helper.make_graph(nodes, "m", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _weights(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _reference(proto: onnx.ModelProto) -> list[np.ndarray]:
    """ONNX Runtime's outputs on feeds(proto)."""
    import onnxruntime as ort

    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds(proto))


def _check(proto: onnx.ModelProto, directory: Path) -> CompiledModel:
    """The built model's outputs on random inputs equal ONNX Runtime's."""
    model = CompiledModel(directory)
    inputs = feeds(proto)
    ours = model.run([inputs[n] for n, _, _ in model.inputs])
    assert compare(ours, _reference(proto)) is None
    return model


def cnn() -> onnx.ModelProto:
    """conv 3x3 -> batch norm -> relu -> max pool -> flatten -> fully connected."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    consts = {"w": _weights(8, 3, 3, 3), "b": _weights(8), "g": _weights(8), "beta": _weights(8),
              "mean": _weights(8), "var": RNG.uniform(0.5, 1.5, 8).astype(np.float32),
              "fw": _weights(10, 8 * 4 * 4), "fb": _weights(10)}
    return _model(nodes, {"x": (TensorProto.FLOAT, [1, 3, 8, 8])}, consts, ["y"])


def test_a_small_cnn_runs_on_the_emulated_gpu_and_matches_onnxruntime(tmp_path):
    proto = cnn()
    directory = build_model(proto, tmp_path, target=EMULATED)
    model = _check(proto, directory)
    manifest = json.loads((directory / "model.json").read_text())
    assert manifest["target"] == EMULATED and {k["schedule"] for k in manifest["kernels"]} == {"default"}
    source = (directory / "model.cu").read_text()
    assert "Transpose" not in str(manifest["kernels"])  # no channels-last rewrite for a GPU
    assert "__global__" in source and "threadIdx.x" in source and "#pragma omp" not in source
    assert "cudaMemcpyHostToDevice" in source and "cudaMemcpyDeviceToHost" in source
    profile = model.profile(feeds(proto), repeat=2)  # per-kernel times: run_timed synchronizes each kernel
    assert [p["kernel"] for p in profile] == [k["name"] for k in manifest["kernels"]] and profile[0]["ms"] > 0


def test_an_attention_block_matches_onnxruntime(tmp_path):
    """Q, K, V projections, scaled scores, Softmax, the weighted sum, a residual Add and LayerNormalization."""
    d = 16
    nodes = [helper.make_node("MatMul", ["x", f"w{n}"], [n]) for n in "qkv"]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]),
              helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Softmax", ["ss"], ["a"], axis=-1),
              helper.make_node("MatMul", ["a", "v"], ["o"]),
              helper.make_node("Add", ["o", "x"], ["res"]),
              helper.make_node("LayerNormalization", ["res", "gamma", "beta"], ["y"], axis=-1)]
    consts = {"wq": _weights(d, d), "wk": _weights(d, d), "wv": _weights(d, d),
              "scale": np.array(d ** -0.5, np.float32), "gamma": _weights(d), "beta": _weights(d)}
    proto = _model(nodes, {"x": (TensorProto.FLOAT, [1, 8, d])}, consts, ["y"])
    _check(proto, build_model(proto, tmp_path, target=EMULATED))


@pytest.mark.parametrize("seed", [2, 5, 9])
def test_random_models_match_onnxruntime(seed, tmp_path):
    """Fuzz graphs (matmuls, reductions; gathers, pads, concats; convs, a transposed conv, layer norms) with default
    GPU schedules; a Gather's id past its table is an error (fuzz_graph_check._check_bounds)."""
    failure = check_model(random_model(np.random.default_rng(seed)), seed, "random", 0, tmp_path, target=EMULATED)
    assert failure is None, failure.headline()


def test_gather_indices_out_of_range_fail_the_run_with_a_message(tmp_path):
    """Ids from the caller are checked on the host; ids a kernel computed are copied back from the device first."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["direct"]),
             helper.make_node("Add", ["ids", "one"], ["shifted"]),
             helper.make_node("Gather", ["table", "shifted"], ["computed"])]
    consts = {"table": _weights(10, 4), "one": np.array(1, np.int64)}
    proto = _model(nodes, {"ids": (TensorProto.INT64, [2, 3])}, consts, ["direct", "computed"])
    model = CompiledModel(build_model(proto, tmp_path, target=EMULATED))
    ids = np.array([[0, 3, 8], [-1, -10, 2]], np.int64)
    direct, computed = model.run([ids])
    np.testing.assert_array_equal(direct, consts["table"][ids])
    np.testing.assert_array_equal(computed, consts["table"][ids + 1])
    with pytest.raises(RuntimeCallError, match=r"value 'shifted' \(indices of Gather .* holds 10 .* \[-10, 10\)"):
        model.run([np.array([[0, 3, 9], [1, 2, 3]], np.int64)])
    with pytest.raises(RuntimeCallError, match=r"input 'ids' \(indices of Gather .* holds -11 .* \[-10, 10\)"):
        model.run([np.array([[0, 3, 4], [1, -11, 3]], np.int64)])
    np.testing.assert_array_equal(model.run([ids])[0], direct)  # the model runs on after a failed run


def _matmul_relu() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    return _model(nodes, {"x": (TensorProto.FLOAT, [16, 32])}, {"w": _weights(32, 24)}, ["y"])


def test_a_task_tuned_for_cuda_is_built_with_its_record(tmp_path):
    """The task scheduler tunes the model's tasks for the emulated GPU with Ansor's policy (GPU sketches, annotation,
    evolution over GPU features; the same measure path as tune()); the build uses the record."""
    proto = _matmul_relu()
    tasks = extract_tasks(load_graph(proto), EMULATED)
    with SQLiteDatabase(tmp_path / "gpu.db") as db:
        TaskScheduler.from_models({"m": tasks}, seed=0, config=SchedulerConfig(round_trials=2)).tune(
            2, db=db, policy="ansor")
        record = db.best(tasks[0].task.workload_key, EMULATED)
        assert record is not None and record.target == EMULATED
        directory = build_model(proto, tmp_path / "out", target=EMULATED, db=db)
    (kernel,) = json.loads((directory / "model.json").read_text())["kernels"]
    assert kernel["schedule"] == "tuned" and kernel["cost"] == pytest.approx(record.result.median_cost)
    _check(proto, directory)


def test_a_program_no_gpu_runs_falls_back_to_the_default_schedule(tmp_path, monkeypatch, caplog):
    """A program whose blocks would have 1536 threads renders with an error; that kernel gets the default schedule."""
    from tensorgen.graph.backend import build as build_module

    def too_wide(subs, *args, **kwargs):
        return [(bind_unbound(State(sub.dag), threads=4096), 1e-6, "tuned") for sub in subs]

    monkeypatch.setattr(build_module, "schedule_subgraphs", too_wide)
    proto = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": (TensorProto.FLOAT, [48, 32])}, {}, ["y"])
    directory = build_model(proto, tmp_path, target=EMULATED)
    (kernel,) = json.loads((directory / "model.json").read_text())["kernels"]
    assert kernel["schedule"] == "default" and "blocks of 1536 threads" in kernel["fallback"]
    assert "gets the default schedule" in caplog.text
    _check(proto, directory)


def test_bad_combinations_are_one_error(tmp_path):
    with pytest.raises(TensorgenError, match="does not follow the layouts of records"):
        build_model(_matmul_relu(), tmp_path, target=EMULATED, layouts="propagate")
    with pytest.raises(TensorgenError, match="under -emulate=1 .* use 1 candidate"):
        build_model(_matmul_relu(), tmp_path, target=EMULATED, candidates=2)


def test_cli_builds_and_runs_for_an_emulated_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proto = _matmul_relu()
    onnx.save(proto, "m.onnx")
    np.savez("in.npz", **feeds(proto))
    assert cli(["build", "m.onnx", "--target", EMULATED, "-o", "built"]) == 0
    assert "model.cu" in capsys.readouterr().out
    assert cli(["run", "built", "--inputs", "in.npz", "-o", "out.npz"]) == 0
    assert compare([np.load("out.npz")["y"]], _reference(proto)) is None
    assert cli(["run", "m.onnx", "--target", EMULATED, "--inputs", "in.npz", "-o", "out2.npz"]) == 0
    np.testing.assert_array_equal(np.load("out2.npz")["y"], np.load("out.npz")["y"])
    capsys.readouterr()
    for bad in (["build", "m.onnx", "--target", EMULATED, "--layouts", "follow", "-o", "x"],
                ["run", "built", "--target", EMULATED, "--inputs", "in.npz", "-o", "x.npz"]):
        assert cli(bad) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and ("layouts" in err or "--target" in err), err


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_nvcc_compiles_a_built_model(tmp_path):
    """`cuda -arch=sm_90` compiles the same source with nvcc (a GPU runs it; none is needed to build it)."""
    directory = build_model(_matmul_relu(), tmp_path, target="cuda -arch=sm_90")
    assert (directory / "model.so").stat().st_size > 0 and "__global__" in (directory / "model.cu").read_text()
    if cuda_available():
        _check(_matmul_relu(), directory)
    else:
        with pytest.raises(RuntimeCallError, match="built for cuda -arch=sm_90, and no CUDA GPU is usable"):
            CompiledModel(directory)
