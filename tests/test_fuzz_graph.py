"""The graph fuzzer (tests/fuzz_graphs.py, tests/fuzz_graph_check.py) on a fixed-seed budget: random ONNX
models, each tuned a few trials per task with one of the policies in turn, built, run and compared with
ONNX Runtime.
`python bench/fuzz.py --minutes N` runs it longer and saves reproducers.

FOUND are the seeds that found a bug, kept as regressions.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from fuzz_graph_check import POLICIES, Failure, check_model, known_bug, validate
from fuzz_graphs import FIRST_OPS, OPS, random_model

TRIALS = 2  # per task
# (seed, policy, trials per task): TopK / Einsum / ReduceSumSquare (6), GatherElements / ScatterElements (30), LRN /
# integer Mod / a traced view (75), ConvTranspose / Resize / LpNormalization (58), CumSum / masks (45), Asinh / CumSum
# (54); every policy but ansor-psa (seed 135 below; the PSA prefilter's tuning: test_tune)
CASES = [(6, "random", TRIALS), (30, "ansor", TRIALS), (75, "ansor", TRIALS), (58, "alt", TRIALS),
         (45, "ansor", TRIALS), (54, "pruner", TRIALS)]
# a fused group of five chained reductions whose 1350 sketches passed the sketch bound, and its tuning stopped with a
# RuntimeError: tests/test_sketch.py checks the bound itself, so this whole tuned model (~20 s) is `slow`
SKETCH_BOUND = (4216, "random", TRIALS)


# seeds that found a bug (fixed in issue 22), kept as regressions: they draw from the first generator's ops
# (FIRST_OPS, opset 17), which wrote the models that found them; seed 202 (random, 6 trials), which found
# gcc's "redefinition of 'input0_at'", is covered faster by tests/test_properties_i22.py. Each bug has a unit test
# of its own in tests/graph/test_i22_ops.py (the pools' ceil_mode windows, NaN through Relu / Clip, Gather's ids), so
# these whole tuned models (10-50 s each) are `slow`
FOUND = [
    (48, "random", TRIALS),  # pool ceil_mode kept a last window lying in the padding (extra row/column)
    (12, "ansor", TRIALS),  # Gather did not check its indices (an id past the table ran without an error)
    (135, "ansor-psa", TRIALS),  # NaN did not propagate through Relu (max written as a > b ? a : b)
    (186, "random", TRIALS),  # NaN did not propagate through Clip (it came out as the upper bound)
]


@pytest.mark.parametrize("seed,policy,trials,first", [(*case, False) for case in CASES] + [
    pytest.param(*case, first, marks=pytest.mark.slow) for case, first in [(SKETCH_BOUND, False)]
    + [(case, True) for case in FOUND]])
def test_random_model_tuned_and_built_matches_onnxruntime(seed, policy, trials, first, tmp_path):
    rng = np.random.default_rng(seed)
    model = random_model(rng, ops=FIRST_OPS, opset=17) if first else random_model(rng)
    failure = check_model(model, seed, policy, trials, tmp_path)
    assert failure is None, f"{failure.headline()} (known: {known_bug(failure)})\n{failure.error}"


def test_the_generator_writes_valid_models_that_cover_the_operators():
    """onnx.checker, strict shape inference and ONNX Runtime accept every model; the ops the fuzzer means
    to reach all appear within 150 seeds, at every opset it writes."""
    seen, opsets = set(), set()
    for seed in range(150):
        model = random_model(np.random.default_rng(seed))
        validate(model)
        seen |= {n.op_type for n in model.graph.node}
        opsets.add(model.opset_import[0].version)
    wanted = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "Concat", "Add", "Mul", "Sub",
              "Div", "MatMul", "Gemm", "LayerNormalization", "Softmax", "Erf", "Tanh", "ReduceMean", "ReduceSum",
              "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Gather", "BatchNormalization",
              "Relu", "Sigmoid", "Clip", "Pow", "Sqrt", "Exp",
              # the ops tensorgen imported later
              "Sin", "Cos", "Tan", "Asin", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Log", "Softplus", "Elu",
              "Floor", "Ceil", "Round", "Sign", "Mod", "Equal", "Less", "Not", "Or", "IsNaN", "Sum", "Max", "Min",
              "Tile", "CumSum", "TopK", "ArgMax", "ArgMin", "Hardmax", "LogSoftmax", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceMax", "Einsum", "GatherElements",
              "ScatterElements", "ScatterND", "OneHot", "Trilu", "DepthToSpace", "LpNormalization", "LRN",
              "InstanceNormalization", "GroupNormalization", "MeanVarianceNormalization", "LpPool", "GlobalMaxPool",
              "RNN", "GRU", "LSTM", "Resize", "Split", "Shape", "Dropout", "Shrink"}
    assert wanted <= seen, sorted(wanted - seen)
    assert opsets == {17, 18, 21}
    assert set(POLICIES) == {"ansor", "random", "ansor-psa", "alt", "pruner"} and "aspp" in OPS


def test_bench_fuzz_runs_one_case_and_a_schedule_budget(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("_bench_fuzz", Path(__file__).parents[1] / "bench" / "fuzz.py")
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    assert fuzz.main(["--case", "13", "--policy", "random", "--trials", "0", "--out", str(tmp_path)]) == 0
    assert fuzz.main(["--schedules", "--minutes", "0.05", "--seed", "0", "--out", str(tmp_path)]) == 0
    assert "schedules," in capsys.readouterr().out
    assert not list(tmp_path.iterdir())  # nothing failed, nothing saved
    failure = Failure(5, "random", "mismatch", "output 0: ...")
    saved = fuzz.save(failure, tmp_path, random_model(np.random.default_rng(5)))
    info = json.loads((saved / "failure.json").read_text())
    assert info["seed"] == 5 and info["reproduce"] == "python bench/fuzz.py --case 5 --policy random"
    assert validate(onnx.load(saved / "model.onnx")) and (saved / "error.txt").read_text() == failure.error
    assert not (saved / "records.jsonl").exists()
    saved = fuzz.save(Failure(6, "random", "measure", "wrong_answer: ...", ['{"a": 1}', '{"b": 2}']), tmp_path)
    assert (saved / "records.jsonl").read_text().splitlines() == ['{"a": 1}', '{"b": 2}']


def test_a_gather_from_a_size_one_axis_is_tuned_without_wrong_answers(tmp_path):
    """The harness filled int64 inputs (a Gather's indices) with 0..3: past an axis of 1 to 3 (qkv[:, :, 2] in
    an exported attention), so every candidate read memory the naive program did not and was stored as a
    wrong answer (found by the graph fuzzer, seed 301)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Gather", ["t", "idx"], ["g"], axis=2), helper.make_node("Mul", ["g", "c"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 1])
    graph = helper.make_graph(nodes, "small_axis", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 1, 3])],
                              [numpy_helper.from_array(np.zeros((2, 1), np.int64), "idx"),
                               numpy_helper.from_array(np.linspace(-1, 1, 3).astype(np.float32), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    failure = check_model(model, 0, "random", 4, tmp_path)
    assert failure is None, failure.error
