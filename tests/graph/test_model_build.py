"""Whole models: fusion into subgraphs, tasks, the memory plan, the compiled model against ONNX Runtime."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tensorgen.cli import main as cli
from tensorgen.errors import RuntimeCallError
from tensorgen.graph.backend.build import build_model
from tensorgen.graph.backend.tasks import extract_tasks
from tensorgen.graph.frontend.onnx_inputs import random_inputs
from tensorgen.graph.load import load_graph
from tensorgen.graph.passes.fusion import partition
from tensorgen.graph.reference.compare import Comparison, onnxruntime_runner
from tensorgen.graph.zoo import build_model as zoo_model
from tensorgen.records.database import SQLiteDatabase
from tensorgen.runtime.model import CompiledModel

SMALL = {
    "resnet18": {"image_size": 32}, "resnet50": {"image_size": 32}, "mobilenet_v2": {"image_size": 32},
    "bert_tiny": {"seq_len": 16}, "dcgan": {}, "resnet3d_18": {"frames": 4, "image_size": 32},
}


def _check_against_ort(proto: onnx.ModelProto, directory: Path, rtol: float = 1e-3) -> CompiledModel:
    graph = load_graph(proto)
    model = CompiledModel(directory, threads=2)
    feeds = random_inputs(proto)
    inputs = [feeds[n] for n in graph.inputs]
    ours = model.run(inputs)
    ref = onnxruntime_runner(proto, graph, 2)(inputs)
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * float(np.abs(b).max(initial=0)))
    return model


@pytest.mark.parametrize("name", sorted(SMALL))
def test_zoo_model_matches_onnxruntime(name, tmp_path):
    proto = zoo_model(name, **SMALL[name])
    _check_against_ort(proto, build_model(proto, tmp_path))


@pytest.mark.slow
def test_bert_base_matches_onnxruntime(tmp_path):
    proto = zoo_model("bert_base", seq_len=32)
    _check_against_ort(proto, build_model(proto, tmp_path))


def test_partition_fuses_like_relay():
    part = partition(load_graph(zoo_model("resnet18", image_size=32)))
    kinds = [[n.op for n in s.nodes] for s in part.subgraphs]
    assert ["Conv", "Add", "Relu"] in kinds and ["Conv", "Relu"] in kinds  # residual add + relu fused into conv
    assert all(s.kind == "compute" for s in part.subgraphs if s.nodes[0].op == "Conv")
    assert "Flatten" not in {op for ops in kinds for op in ops}  # reshape-like: an alias, no kernel
    made: set[str] = set(part.graph.inputs) | set(part.graph.constants)
    for sub in part.subgraphs:  # every kernel runs after the kernels it reads
        assert all(part.aliases.get(n, n) in made for n in sub.inputs)
        made |= set(sub.outputs)


def test_an_elementwise_producer_fuses_into_the_reduction_it_feeds(tmp_path):
    """RMSNorm as HuggingFace's Llama writes it, x * (mean(x^2) + eps)^-0.5 * w: the square joins the mean's kernel
    (one kernel, not a pass writing x^2 out and another reading it back). A LayerNorm written out: the centred
    values are read twice, so the square starts the variance's kernel; a reduction never joins a group that starts
    with one (the first mean and its Sub). Both compared with ONNX Runtime."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])
    inits = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("eps", TensorProto.FLOAT, [],
             [1e-6]), helper.make_tensor("w", TensorProto.FLOAT, [16], np.linspace(0.5, 1.5, 16))]
    nodes = [helper.make_node("Relu", ["x"], ["h"]),  # read twice: the square starts a group of its own
             helper.make_node("Pow", ["h", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
             helper.make_node("Add", ["ms", "eps"], ["v"]), helper.make_node("Sqrt", ["v"], ["r"]),
             helper.make_node("Div", ["h", "r"], ["n"]), helper.make_node("Mul", ["n", "w"], ["y"])]
    proto = helper.make_model(helper.make_graph(nodes, "rms", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    kinds = [[n.op for n in s.nodes] for s in partition(load_graph(proto)).subgraphs]
    assert kinds == [["Relu"], ["Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul"]]
    _check_against_ort(proto, build_model(proto, tmp_path / "rms"), rtol=1e-5)
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("ReduceMean", ["h"], ["m"], axes=[-1]),
             helper.make_node("Sub", ["h", "m"], ["d"]), helper.make_node("Pow", ["d", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]), helper.make_node("Add", ["var", "eps"], ["v"]),
             helper.make_node("Sqrt", ["v"], ["r"]), helper.make_node("Div", ["d", "r"], ["y"])]
    proto = helper.make_model(helper.make_graph(nodes, "ln", [x], [y], inits[:2]),
                              opset_imports=[helper.make_opsetid("", 17)])
    kinds = [[n.op for n in s.nodes] for s in partition(load_graph(proto)).subgraphs]
    assert kinds == [["Relu"], ["ReduceMean", "Sub"], ["Pow", "ReduceMean", "Add", "Sqrt", "Div"]]
    _check_against_ort(proto, build_model(proto, tmp_path / "ln"), rtol=1e-5)


def test_identical_subgraphs_become_one_weighted_task():
    part = partition(load_graph(zoo_model("bert_tiny", seq_len=16)))
    tasks = extract_tasks(part)
    assert sum(t.weight for t in tasks) == len(part.subgraphs)
    assert len(tasks) < len(part.subgraphs) and max(t.weight for t in tasks) >= 2
    assert len({t.task.workload_key for t in tasks}) == len(tasks)


def test_batch1_conv_epilogues_can_fuse_into_the_conv_tile():
    """The bias add and activation of a batch-1 conv read the conv at their own axes (not at a literal 0
    for the size-1 batch dim), so every conv task gets Ansor's fused sketches, not only a separate pass."""
    from tensorgen.schedule.steps import CacheWriteStep, ComputeAtStep
    from tensorgen.search.sketch import generate_sketches

    tasks = extract_tasks(load_graph(zoo_model("mobilenet_v2", image_size=32)))
    tasks = [t for t in tasks if t.task.desc.startswith("conv_")]
    assert tasks
    for t in tasks:
        kinds = [{type(x) for x in s.steps} for s in generate_sketches(t.task)]
        fused = [k for k in kinds if ComputeAtStep in k and CacheWriteStep not in k]
        assert len(fused) == 2, t.task.desc  # the epilogue fused at tile levels 1 and 2


def test_memory_plan_reuses_and_never_overlaps_live_values(tmp_path):
    from tensorgen.graph.backend.build import _in_place
    from tensorgen.graph.backend.executor import plan_memory

    part = partition(load_graph(zoo_model("resnet18", image_size=32)))
    plan = plan_memory(part, _in_place(part))
    assert plan.arena_bytes < plan.naive_bytes / 2
    graph = part.graph
    born, last = {}, {}
    for k, sub in enumerate(part.subgraphs):
        for n in sub.inputs:
            last[part.aliases.get(n, n)] = k
        for n in sub.outputs:
            born[n] = k
    live = [(n, born[n], last.get(n, born[n]), plan.offsets[n], graph.value(n).nbytes) for n in plan.offsets]
    handovers = {(part.aliases.get(v, v), part.subgraphs[k].outputs[0]) for k, v in plan.overwritten.items()}
    assert len(handovers) == 8  # ResNet-18's residual blocks write over their residual
    for a in live:
        for b in live:
            if a[0] < b[0] and a[1] <= b[2] and b[1] <= a[2] and {(a[0], b[0]), (b[0], a[0])}.isdisjoint(handovers):
                assert a[3] + a[4] <= b[3] or b[3] + b[4] <= a[3], (a, b)  # lifetimes overlap: memory must not


def _fused(nodes: list, inputs: dict[str, list[int]], consts: dict[str, np.ndarray]):
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
    out = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)
    inits = [helper.make_tensor(n, TensorProto.FLOAT, v.shape, v.ravel()) for n, v in consts.items()]
    graph = helper.make_graph(nodes, "g", ins, [out], inits)
    part = partition(load_graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)))
    assert len(part.subgraphs) == 1
    return part.subgraphs[0], part.graph


def test_an_output_overwrites_only_inputs_read_elementwise_at_its_own_index():
    from tensorgen.graph.passes.fusion import overwritable_input

    w = {"w": np.ones((4, 4), np.float32)}
    residual = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "r"], ["a"]),
                helper.make_node("Relu", ["a"], ["y"])]
    assert overwritable_input(*_fused(residual, {"x": [2, 4], "r": [2, 4]}, w)) == "r"
    reread = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "x"], ["y"])]
    assert overwritable_input(*_fused(reread, {"x": [2, 4]}, w)) is None  # the MatMul reads x at other indices
    broadcast = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    assert overwritable_input(*_fused(broadcast, {"x": [2, 4], "b": [1, 4]}, w)) is None


def test_a_kernel_writing_over_its_input_drops_restrict_on_both(tmp_path):
    proto = zoo_model("resnet18", image_size=32)
    source = (build_model(load_graph(proto), tmp_path) / "model.c").read_text()
    heads = [line for line in source.splitlines() if line.startswith("void k") and "_add_relu(" in line]
    assert len(heads) == 8 and all(h.count("restrict") == h.count(",") - 1 for h in heads), heads
    _check_against_ort(proto, tmp_path)


def _tiny_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], np.linspace(-1, 1, 32).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["y"])]
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [2, 4])
    graph = helper.make_graph(nodes, "tiny", [x], [y], [w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_tuned_records_are_used(tmp_path):
    from tensorgen.tuning.tune import tune

    proto = _tiny_model()
    db = SQLiteDatabase(tmp_path / "t.db")
    for t in extract_tasks(load_graph(proto)):
        tune(t.task, trials=4, db=db, policy="random", seed=4)
    directory = build_model(proto, tmp_path / "out", db=db)
    manifest = json.loads((directory / "model.json").read_text())
    assert all(k["tuned"] for k in manifest["kernels"])
    model = _check_against_ort(proto, directory, rtol=1e-5)
    feeds = random_inputs(proto)
    profile = model.profile([feeds[n] for n in load_graph(proto).inputs], repeat=3)
    assert [p["kernel"] for p in profile] == [k["name"] for k in manifest["kernels"]]
    assert all(p["ms"] > 0 and p["tuned_ms"] == pytest.approx(k["cost"] * 1e3)
               for p, k in zip(profile, manifest["kernels"]))


def test_a_boolean_mask_input_is_read_as_bytes(tmp_path):
    """A bool graph input (an attention mask) crosses into kernels as NumPy holds it, one byte an element, both
    when measured in tuning and in the built model; the output matches ONNX Runtime's."""
    from tensorgen.tuning.tune import tune

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])
    mask = helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])
    minus_inf = helper.make_tensor("minus_inf", TensorProto.FLOAT, [], [-np.inf])
    nodes = [helper.make_node("Where", ["mask", "x", "minus_inf"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "masked", [x, mask], [y], [minus_inf])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    db = SQLiteDatabase(tmp_path / "t.db")
    for t in extract_tasks(load_graph(proto)):
        result = tune(t.task, trials=3, db=db, policy="random", seed=1)
        assert result.best_state is not None  # measured correct through the harness
    feeds = random_inputs(proto)
    feeds["mask"][..., 0] = True  # every row attends somewhere
    model = CompiledModel(build_model(proto, tmp_path / "out", db=db), threads=2)
    ours = model.run([feeds["x"], feeds["mask"]])[0]
    ref = onnxruntime_runner(proto, load_graph(proto), 2)([feeds["x"], feeds["mask"]])[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_tuned_conv_weights_are_repacked_at_build_time(tmp_path):
    """Records measured with a rewritten weight layout build with the weight repacked (Ansor §4.2)."""
    from tensorgen.schedule.layout_rewrite import plan_layout_rewrites
    from tensorgen.tuning.tune import tune

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8, 3, 3],
                           np.random.default_rng(0).uniform(-1, 1, 16 * 8 * 9).astype(np.float32))
    conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    graph = helper.make_graph([conv, helper.make_node("Relu", ["c"], ["y"])], "conv", [x], [y], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    db = SQLiteDatabase(tmp_path / "t.db")
    rewritten = False
    for t in extract_tasks(load_graph(proto)):
        result = tune(t.task, trials=8, db=db, seed=0)
        rewritten |= bool(plan_layout_rewrites(result.best_state))
    assert rewritten
    directory = build_model(proto, tmp_path / "out", db=db)
    assert (directory / "weights.bin").stat().st_size >= 16 * 8 * 9 * 4
    _check_against_ort(proto, directory, rtol=1e-4)


def test_untuned_conv_gets_the_tuned_similar_conv_program(tmp_path):
    """A subgraph without a record is built with the best program of a tuned one of the same structure,
    adapted to its shapes (tensorgen.search.transfer) — and still matches ONNX Runtime."""
    from tensorgen.tuning.tune import tune

    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 12, 12])
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [16, 8, 3, 3], rng.uniform(-1, 1, 16 * 8 * 9).astype(np.float32))
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [24, 16, 3, 3], rng.uniform(-1, 1, 24 * 16 * 9).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c2"], ["y"])]
    proto = helper.make_model(helper.make_graph(nodes, "two_convs", [x], [y], [w1, w2]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    first, second = [t for t in extract_tasks(load_graph(proto)) if t.task.desc.startswith("conv")]
    db = SQLiteDatabase(tmp_path / "t.db")
    tune(first.task, trials=8, db=db, seed=0)
    directory = build_model(proto, tmp_path / "out", db=db)
    kernels = json.loads((directory / "model.json").read_text())["kernels"]
    assert [k["schedule"] for k in kernels if "conv" in k["name"]] == ["tuned", "transferred"]
    _check_against_ort(proto, directory, rtol=1e-4)


def test_c_example_runs_the_model_without_python(tmp_path):
    proto = _tiny_model()
    directory = build_model(proto, tmp_path / "out")
    exe = tmp_path / "run_model"
    example = Path(__file__).resolve().parents[2] / "examples" / "run_model.c"
    subprocess.run(["gcc", "-O2", str(example), "-o", str(exe), str(directory / "model.so"),
                    f"-Wl,-rpath,{directory}"], check=True)
    x = np.arange(16, dtype=np.float32).reshape(2, 8) / 10
    x.tofile(tmp_path / "x.bin")
    out = subprocess.run([str(exe), str(directory), str(tmp_path / "x.bin")], cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout
    assert "latency:" in out
    from_c = np.fromfile(tmp_path / "output0.bin", dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(from_c, np.maximum(x @ np.linspace(-1, 1, 32).astype(np.float32).reshape(8, 4), 0),
                               rtol=1e-6)


def test_cli_models_build_bench(tmp_path, capsys, monkeypatch, quick_timing):
    monkeypatch.chdir(tmp_path)  # no tuning.db here, and no --db: every kernel untuned
    assert cli(["models"]) == 0
    assert "resnet50" in capsys.readouterr().out
    path = tmp_path / "tiny.onnx"
    onnx.save(_tiny_model(), path)
    assert cli(["build", str(path), "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.so").exists()
    capsys.readouterr()
    assert cli(["bench", str(path), "--blocks", "2", "--profile", "--json",
                str(tmp_path / "b.json")]) == 0
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["max_abs_err_vs_onnxruntime"] < 1e-5 and result["tensorgen_ms"] > 0
    assert result["total_tasks"] == 1 and result["tuned_tasks"] == 0
    (kernel,) = result["kernels"]
    assert kernel["ms"] > 0 and kernel["tuned_ms"] is None and kernel["kernel"] in capsys.readouterr().out
    assert {"onnxruntime_ms", "torch_ms"} <= set(result)
    rounds = len(result["blocks_ms"]["tensorgen"])
    assert 2 <= rounds <= 9 and len(result["blocks_ms"]["onnxruntime"]) == rounds  # more while they disagree
    assert isinstance(result["reliable"], bool)


def test_the_speedup_is_the_ratio_of_the_medians_the_table_shows():
    """One statistic (issue 22): a speedup derived from the same medians as the ms columns cannot contradict them,
    as a median of per-round ratios next to medians of times could."""
    result = Comparison("m", 2, 1.0, 1.2, 2.0, None, 0, 1, 0.0)
    assert result.ratios() == {"onnxruntime": pytest.approx(1.2), "torch": pytest.approx(2.0)}


def test_cli_errors_are_one_line(capsys):
    assert cli(["build", "no_such_model", "-o", "/tmp/x"]) == 2
    assert "no_such_model" in capsys.readouterr().err


def test_cli_tune_model_then_build_uses_the_records(tmp_path, capsys):
    path, db = tmp_path / "tiny.onnx", str(tmp_path / "t.db")
    onnx.save(_tiny_model(), path)
    assert cli(["tune", str(path), "--trials", "4", "--policy", "random", "--db", db,
                "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "estimated end-to-end latency" in out and "Task" in out
    result = json.loads((tmp_path / "t.json").read_text())
    assert result["trials"] == 4 and result["tasks"][0]["best_seconds"] > 0
    assert cli(["build", str(path), "--db", db, "-o", str(tmp_path / "out"), "--candidates", "2"]) == 0
    assert "in-model selection" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "out" / "model.json").read_text())
    assert all(k["tuned"] and k["rank"] in (0, 1) for k in manifest["kernels"])


def test_layers_bench_times_every_kernel_inside_the_model(tmp_path):
    """bench/layers.py: the timed rebuild runs, every kernel gets a time, every conv an ORT Conv node."""
    import importlib.util
    import sys

    sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))  # layers imports tensorgen/timing.py
    spec = importlib.util.spec_from_file_location("_bench_layers", Path(__file__).parents[2] / "bench" / "layers.py")
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    model = tmp_path / "resnet18.onnx"
    onnx.save(zoo_model("resnet18", image_size=32), model)
    out = tmp_path / "layers.json"
    assert layers.main([str(model), "--db", str(tmp_path / "empty.db"), "--runs", "2", "--rounds", "2",
                        "--max-rounds", "3", "--pause", "0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    kernels = result["kernels"]
    assert 2 <= result["totals"]["rounds"] <= 3 and len(result["totals"]["rounds_s"]["onnxruntime"]) >= 2
    assert len(kernels) == len(partition(load_graph(str(model))).subgraphs) and all(k["ms"] > 0 for k in kernels)
    convs = [k for k in kernels if "conv" in k["kernel"]]
    assert len(convs) == 20 and all(k["onnxruntime"] and "Conv" in k["onnxruntime"]["op"] for k in convs)


def test_unaligned_and_strided_inputs_run_like_aligned_ones(tmp_path):
    proto = _tiny_model()
    model = CompiledModel(build_model(proto, tmp_path / "out"))
    x = random_inputs(proto)["x"]
    expected = model.run([x])[0]
    raw = np.zeros(x.size + 1, np.float32)
    unaligned = raw[1:].reshape(x.shape)  # 4 bytes past an allocation: never 64-byte aligned
    unaligned[...] = x
    strided = np.asfortranarray(x)
    for arr in (unaligned, strided):
        np.testing.assert_array_equal(model.run([arr])[0], expected)
    np.testing.assert_array_equal(unaligned, x)  # the caller's array is left alone


def test_outputs_are_written_into_the_arrays_given(tmp_path):
    """run(out=...) writes into preallocated outputs (the work ONNX Runtime's io_binding does per call) and
    refuses arrays of another shape, dtype or layout, or read-only ones, in one line."""
    proto = _tiny_model()
    model = CompiledModel(build_model(proto, tmp_path / "out"))
    x = random_inputs(proto)["x"]
    expected = model.run([x])[0]
    out = np.full(expected.shape, np.nan, np.float32)
    assert model.run([x], out=[out])[0] is out
    np.testing.assert_array_equal(out, expected)
    readonly = np.zeros_like(out)
    readonly.flags.writeable = False
    strided = np.zeros(out.shape + (2,), np.float32)[..., 0]
    for bad in ([], [out.astype(np.float64)], [out.reshape(-1)], [strided], [readonly], [out.tolist()]):
        with pytest.raises(RuntimeCallError, match="output"):
            model.run([x], out=bad)


def test_ab_models_bench_compares_two_builds(tmp_path, capsys):
    """bench/ab_models.py: two builds of one model timed in one process; identical builds agree exactly."""
    import importlib.util
    import sys

    sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))  # ab_models imports tensorgen/timing.py
    spec = importlib.util.spec_from_file_location("_bench_ab", Path(__file__).parents[2] / "bench" / "ab_models.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    model = tmp_path / "tiny.onnx"
    onnx.save(_tiny_model(), model)
    a, b = build_model(str(model), tmp_path / "a"), build_model(str(model), tmp_path / "b")
    out = tmp_path / "ab.json"
    assert ab.main([str(model), str(a), str(b), "--rounds", "2", "--max-rounds", "2", "--bound", "1000",
                    "--profile-rounds", "1", "--pause", "0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["max_abs_diff"] == 0.0 and len(result["timing"]["rounds_s"]["a"]) == 2 and result["a_over_b"] > 0
    assert result["a_over_b"] == pytest.approx(result["ms"]["a"] / result["ms"]["b"]) and result["reliable"]
    assert set(result["kernels_ms"]) == {k["name"] for k in json.loads((a / "model.json").read_text())["kernels"]}
    assert "a/b" in capsys.readouterr().out


def test_kernels_with_reordered_parallel_loops_match_onnxruntime(tmp_path, monkeypatch):
    """graph.align may visit any kernel's fused parallel loop in another digit order: with every such loop
    of a tuned 1x1 -> depthwise -> 1x1 conv chain reversed, the model still computes what ORT does."""
    import tensorgen.graph.backend.build as build
    from tensorgen.graph.backend.align import digits, reorder
    from tensorgen.loopir.nodes import For, statements
    from tensorgen.measure.runner import LocalRunner
    from tensorgen.schedule.lower import lower
    from tensorgen.tuning.tune import MeasureConfig, tune

    rng = np.random.default_rng(0)

    def weight(name, shape):
        values = rng.uniform(-1, 1, int(np.prod(shape))).astype(np.float32)
        return helper.make_tensor(name, TensorProto.FLOAT, shape, values)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=32),
             helper.make_node("Relu", ["c2"], ["r2"]), helper.make_node("Conv", ["r2", "w3"], ["y"])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])],
                              [weight("w1", [32, 16, 1, 1]), weight("w2", [32, 1, 3, 3]), weight("w3", [16, 32, 1, 1])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    def fused_parallel(body) -> bool:
        """Whether the function body is a parallel loop over several digits (the loops align may reorder)."""
        loop = next((s for s in statements(body) if isinstance(s, For) and s.kind == "parallel"), None)
        return loop is body and sum(r > 1 for r in digits(loop)) > 1

    class PrefersFusedParallel(LocalRunner):
        """Real measurements, read 1000x faster for a program with a fused parallel loop: the build takes those
        (whatever this machine's load makes of the timings)."""

        def run(self, inputs, build_results):
            return [replace(r, costs=tuple(c / 1000 for c in r.costs)) if fused_parallel(lower(i.state).body) else r
                    for i, r in zip(inputs, super().run(inputs, build_results))]

    db = SQLiteDatabase(tmp_path / "t.db")
    for t in extract_tasks(load_graph(proto)):
        tune(t.task, trials=8, db=db, policy="random", seed=4, measure=MeasureConfig(runner=PrefersFusedParallel()))
    reordered = []

    def reverse_all(funcs, values, threads):
        out = []
        for f in funcs:
            body = f.body
            for loop in [s for s in statements(body) if isinstance(s, For) and s.kind == "parallel"][:1]:
                radices = digits(loop)
                if fused_parallel(body):
                    body = reorder(loop, radices, tuple(range(len(radices))))  # least significant digit first
                    reordered.append(f.name)
            out.append(f if body is f.body else type(f)(f.name, f.args, body, f.attrs))
        return out

    monkeypatch.setattr(build, "align_partitions", reverse_all)
    _check_against_ort(proto, build_model(proto, tmp_path / "out", db=db), rtol=1e-4)
    assert reordered


def test_an_output_with_as_many_channels_as_rows_and_columns_is_transposed_back(tmp_path):
    """A conv's (1, 16, 16, 16) output is the same shape channels-first and channels-last; going back to
    channels-first is still a transpose, not a reshape (it once was, and the model returned NHWC data)."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8, 1, 1], np.linspace(-1, 1, 128).astype(np.float32))
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "square",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _check_against_ort(proto, build_model(proto, tmp_path), rtol=1e-5)
