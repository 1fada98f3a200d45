"""Graph passes: each rewritten graph, run by ONNX Runtime through export_onnx, must compute what ORT
computes on the original model, with the expected (fewer) nodes and the same output names."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from test_onnx_frontend import X3, X4, F, feeds_for, i64, make_model, node, run_graph, run_ort, w

from tensorgen.graph import Graph, Node, Value
from tensorgen.graph.frontend.onnx_import import import_onnx
from tensorgen.graph.passes import (
    eliminate_dead_code,
    fold_batch_norm,
    fold_constants,
    optimize,
    remove_identities,
    remove_noops,
    simplify_reshapes,
)


def check_pass(nodes, inputs, outputs, inits, rewrite: Callable[[Graph], Graph], ops: list[str]) -> Graph:
    model = make_model(nodes, inputs, outputs, inits)
    graph = import_onnx(model)
    before = [(n.op, n.inputs, n.outputs) for n in graph]
    result = rewrite(graph)
    assert [(n.op, n.inputs, n.outputs) for n in graph] == before  # the input graph is left alone
    assert [n.op for n in result] == ops
    assert result.outputs == list(outputs) and result.inputs == graph.inputs
    result.validate()
    feeds = feeds_for(inputs)
    for got, ref in zip(run_graph(result, feeds), run_ort(model, feeds)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    return result


def bn_stats(channels: int) -> dict[str, np.ndarray]:
    return {"g": w(channels), "b": w(channels), "m": w(channels), "v": np.abs(w(channels)) + 0.5}


BN = ["g", "b", "m", "v"]


# ------------------------------------------------------------------------------------ batch norm
@pytest.mark.parametrize("bias", [True, False])
def test_bn_folds_into_conv(bias: bool):
    inits = {"cw": w(4, 3, 3, 3), **({"cb": w(4)} if bias else {}), **bn_stats(4)}
    nodes = [node("Conv", ["x", "cw", *(["cb"] if bias else [])], ["c"], pads=[1, 1, 1, 1]),
             node("BatchNormalization", ["c", *BN], ["y"], epsilon=1e-3)]
    g = check_pass(nodes, X4, ["y"], inits, fold_batch_norm, ["Conv"])
    assert g.nodes[0].outputs == ["y"] and "cw" not in g.constants and "m" not in g.constants


@pytest.mark.parametrize(("trans_b", "bias"), [(0, None), (1, (4,)), (0, (3, 4)), (1, ())])
def test_bn_folds_into_gemm(trans_b: int, bias: tuple[int, ...] | None):
    inits = {"gb": w(4, 5) if trans_b else w(5, 4), **({"gc": w(*bias)} if bias is not None else {}), **bn_stats(4)}
    nodes = [node("Gemm", ["a", "gb", *(["gc"] if bias is not None else [])], ["t"], transB=trans_b, alpha=0.7,
                  beta=1.3),
             node("BatchNormalization", ["t", *BN], ["y"])]
    g = check_pass(nodes, {"a": ((3, 5), F)}, ["y"], inits, fold_batch_norm, ["Gemm"])
    assert g.nodes[0].attrs["beta"] == 1.0


@pytest.mark.parametrize("bias_first", [False, True])
def test_bn_folds_into_matmul_add(bias_first: bool):
    add = ["bias", "t"] if bias_first else ["t", "bias"]
    nodes = [node("MatMul", ["a", "mw"], ["t"]), node("Add", add, ["u"]), node("BatchNormalization", ["u", *BN], ["y"])]
    inits = {"mw": w(5, 4), "bias": w(1, 4), **bn_stats(4)}
    check_pass(nodes, {"a": ((3, 5), F)}, ["y"], inits, fold_batch_norm, ["MatMul", "Add"])


def test_bn_folds_into_matmul_as_bias():
    nodes = [node("MatMul", ["a", "mw"], ["t"]), node("BatchNormalization", ["t", *BN], ["y"])]
    check_pass(nodes, {"a": ((3, 5), F)}, ["y"], {"mw": w(5, 4), **bn_stats(4)}, fold_batch_norm, ["MatMul", "Add"])


@pytest.mark.parametrize("group", [1, 2])
def test_bn_folds_into_conv_transpose(group: int):
    nodes = [node("ConvTranspose", ["x", "cw", "cb"], ["c"], strides=[2, 2], group=group),
             node("BatchNormalization", ["c", *BN], ["y"])]
    inits = {"cw": w(4, 6 // group, 3, 3), "cb": w(6), **bn_stats(6)}
    check_pass(nodes, {"x": ((1, 4, 5, 5), F)}, ["y"], inits, fold_batch_norm, ["ConvTranspose"])


def test_bn_stays_when_conv_output_is_read_elsewhere():
    nodes = [node("Conv", ["x", "cw"], ["c"]), node("BatchNormalization", ["c", *BN], ["y"]),
             node("Relu", ["c"], ["z"])]
    check_pass(nodes, X4, ["y", "z"], {"cw": w(4, 3, 1, 1), **bn_stats(4)}, fold_batch_norm,
               ["Conv", "BatchNormalization", "Relu"])


def test_standalone_bn_and_bn_after_batched_matmul_stay():
    nodes = [node("BatchNormalization", ["x", *BN], ["y"]), node("MatMul", ["x", "mw"], ["t"]),
             node("BatchNormalization", ["t", "g2", "b2", "m2", "v2"], ["z"])]
    stats2 = {f"{k}2": v for k, v in bn_stats(3).items()}
    check_pass(nodes, X3, ["y", "z"], {"mw": w(4, 4), **bn_stats(3), **stats2}, fold_batch_norm,
               ["BatchNormalization", "MatMul", "BatchNormalization"])


# ------------------------------------------------------------------------------ identities, dead code
def test_identity_feeding_output_renames_producer():
    nodes = [node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["i"]), node("Identity", ["i"], ["y"]),
             node("Dropout", ["r"], ["d"]), node("Sigmoid", ["d"], ["z"])]
    g = check_pass(nodes, X3, ["y", "z"], {}, remove_identities, ["Relu", "Sigmoid"])
    assert g.nodes[0].outputs == ["y"] and g.nodes[1].inputs == ["y"]


def test_identity_between_input_and_output_stays():
    nodes = [node("Identity", ["x"], ["y"]), node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["z"]),
             node("Identity", ["r"], ["t"])]
    g = check_pass(nodes, X3, ["y", "z", "t"], {}, remove_identities, ["Identity", "Relu", "Identity"])
    assert g.nodes[1].outputs == ["z"] and g.nodes[2].inputs == ["z"] and g.nodes[2].outputs == ["t"]


def test_dead_code_eliminated():
    nodes = [node("Relu", ["x"], ["r"]), node("Exp", ["r"], ["dead"]), node("Split", ["r"], ["s1", "s2"], axis=0),
             node("Tanh", ["s1"], ["y"])]
    g = check_pass(nodes, X3, ["y"], {}, eliminate_dead_code, ["Relu", "Split", "Tanh"])
    assert "dead" not in g.values and g.nodes[1].outputs == ["s1", "s2"]


def test_fold_constants_on_graph():
    """A transposed weight feeding MatMul, as graphs built by other frontends contain."""
    wt = w(5, 4)
    values = {"x": Value("x", (2, 4), F), "wt": Value("wt", (5, 4), F), "wm": Value("wm", (4, 5), F),
              "y": Value("y", (2, 5), F)}
    graph = Graph("g", ["x"], ["y"], [Node("Transpose", "t", ["wt"], ["wm"], {"perm": (1, 0)}),
                                       Node("MatMul", "mm", ["x", "wm"], ["y"])], values, {"wt": wt})
    folded = fold_constants(graph)
    assert [n.op for n in folded] == ["MatMul"] and set(folded.constants) == {"wm"}
    np.testing.assert_array_equal(folded.constants["wm"], wt.T)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(run_graph(folded, {"x": x})[0], x @ wt.T, rtol=1e-6)


# ---------------------------------------------------------------------------- reshape chains, no-ops
def simplify_and_clean(graph: Graph) -> Graph:
    return optimize(graph, [simplify_reshapes, remove_noops, eliminate_dead_code])


@pytest.mark.parametrize(("nodes", "inits", "ops"), [
    pytest.param([node("Reshape", ["x", "s1"], ["a"]), node("Reshape", ["a", "s2"], ["y"])],
                 {"s1": i64(6, 4), "s2": i64(4, 6)}, ["Reshape"], id="reshape_reshape"),
    pytest.param([node("Unsqueeze", ["x", "ax"], ["a"]), node("Squeeze", ["a", "ax2"], ["b"]),
                  node("Flatten", ["b"], ["c"], axis=1), node("Reshape", ["c", "s1"], ["y"])],
                 {"ax": i64(0), "ax2": i64(0), "s1": i64(6, 4)}, ["Reshape"], id="unsqueeze_squeeze_flatten_reshape"),
    pytest.param([node("Reshape", ["x", "s1"], ["a"]), node("Reshape", ["a", "s2"], ["y"])],
                 {"s1": i64(6, 4), "s2": i64(2, 3, 4)}, ["Identity"], id="reshape_back_to_input_shape"),
    pytest.param([node("Relu", ["x"], ["r"]), node("Reshape", ["r", "s1"], ["y"])], {"s1": i64(2, 3, 4)},
                 ["Relu"], id="reshape_to_same_shape"),
    pytest.param([node("Relu", ["x"], ["r"]), node("Unsqueeze", ["r", "ax"], ["a"]),
                  node("Squeeze", ["a", "ax"], ["b"]), node("Exp", ["b"], ["y"])],
                 {"ax": i64(1)}, ["Relu", "Exp"], id="unsqueeze_squeeze_noop"),
    pytest.param([node("Transpose", ["x"], ["a"], perm=[1, 2, 0]), node("Transpose", ["a"], ["y"], perm=[0, 2, 1])],
                 {}, ["Transpose"], id="transpose_transpose"),
    pytest.param([node("Relu", ["x"], ["r"]), node("Transpose", ["r"], ["a"], perm=[1, 2, 0]),
                  node("Transpose", ["a"], ["y"], perm=[2, 0, 1])], {}, ["Relu"], id="transpose_pair_identity"),
])
def test_reshape_chains_simplified(nodes, inits, ops):
    g = check_pass(nodes, X3, ["y"], inits, simplify_and_clean, ops)
    if ops[0] in ("Reshape", "Transpose"):
        assert g.nodes[0].inputs == ["x"]


def test_simplify_reshapes_alone_rewires_chain_end():
    nodes = [node("Reshape", ["x", "s1"], ["a"]), node("Unsqueeze", ["a", "ax"], ["y"])]
    g = check_pass(nodes, X3, ["y"], {"s1": i64(6, 4), "ax": i64(0)}, simplify_reshapes, ["Reshape", "Reshape"])
    assert g.nodes[1].inputs == ["x"] and g.nodes[1].attrs == {"shape": (1, 6, 4)}


@pytest.mark.parametrize(("noop", "inits"), [
    (node("Cast", ["r"], ["n"], to=onnx.TensorProto.FLOAT), {}),
    (node("Pad", ["r", "p"], ["n"]), {"p": i64(0, 0, 0, 0, 0, 0)}),
    (node("Slice", ["r", "s", "e"], ["n"]), {"s": i64(0), "e": i64(99)}),
    (node("Concat", ["r"], ["n"], axis=0), {}),
    (node("Expand", ["r", "s"], ["n"]), {"s": i64(3, 1)}),
    (node("Transpose", ["r"], ["n"], perm=[0, 1, 2]), {}),
    (node("Squeeze", ["r"], ["n"]), {}),
], ids=lambda v: v.op_type if hasattr(v, "op_type") else "")
def test_noops_removed(noop, inits):
    nodes = [node("Relu", ["x"], ["r"]), noop, node("Exp", ["n"], ["y"])]
    check_pass(nodes, X3, ["y"], inits, remove_noops, ["Relu", "Exp"])


def test_shared_reshape_prefix_kept_for_its_other_reader():
    nodes = [node("Reshape", ["x", "s1"], ["a"]), node("Reshape", ["a", "s2"], ["y"]), node("Relu", ["a"], ["z"])]
    g = check_pass(nodes, X3, ["y", "z"], {"s1": i64(6, 4), "s2": i64(24)}, simplify_and_clean,
                   ["Reshape", "Reshape", "Relu"])
    assert g.nodes[1].inputs == ["x"] and g.nodes[1].attrs == {"shape": (24,)}


# ------------------------------------------------------------------------------------------ optimize
def test_optimize_small_convnet():
    nodes = [node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]), node("BatchNormalization", ["c", *BN], ["n"]),
             node("Relu", ["n"], ["r"]), node("Dropout", ["r"], ["d"]), node("GlobalAveragePool", ["d"], ["p"]),
             node("Flatten", ["p"], ["f"]), node("Reshape", ["f", "s"], ["f2"]), node("Identity", ["f2"], ["i"]),
             node("Gemm", ["i", "fw", "fb"], ["logits"], transB=1), node("Softmax", ["logits"], ["y"]),
             node("Exp", ["r"], ["unused"])]
    inits = {"cw": w(4, 3, 3, 3), "cb": w(4), **bn_stats(4), "s": i64(1, 4), "fw": w(10, 4), "fb": w(10)}
    ops = ["Conv", "Relu", "GlobalAveragePool", "Reshape", "Gemm", "Softmax"]
    g = check_pass(nodes, X4, ["y"], inits, optimize, ops)
    assert g.nodes[3].inputs == ["p"] and g.nodes[3].attrs == {"shape": (1, 4)}
