"""Canonical forms (tensorgen.graph.passes.canonical): what PyTorch's export and ONNX exporters write differently
becomes one graph. Each rewritten graph, run by ONNX Runtime, computes what ORT computes on the original."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_onnx_frontend import F, i64, make_model, node, w
from test_passes import check_pass

from tensorgen.graph import Node
from tensorgen.graph.frontend.onnx_import import import_onnx
from tensorgen.graph.passes import optimize
from tensorgen.graph.passes.canonical import REWRITES, Rewrite, canonicalize


def linear(x_shape, rows, out_shape, bias=True, trans_b=1, beta=1.0, alpha=1.0):
    """x -> Reshape(rows, k) -> Gemm -> Reshape(out_shape), as torch.export writes nn.Linear."""
    k, m = math.prod(x_shape) // rows, math.prod(out_shape) // rows
    weight = w(m, k) if trans_b else w(k, m)
    nodes = [node("Reshape", ["x", "flat"], ["r"]),
             node("Gemm", ["r", "W", *(["B"] if bias else [])], ["g"], transB=trans_b, beta=beta, alpha=alpha),
             node("Reshape", ["g", "unflat"], ["y"])]
    inits = {"flat": i64(rows, k), "W": weight, "unflat": i64(*out_shape), **({"B": w(m)} if bias else {})}
    return nodes, {"x": (x_shape, F)}, inits


@pytest.mark.parametrize(("x_shape", "out_shape", "bias", "trans_b", "ops"), [
    ((2, 3, 4), (2, 3, 5), True, 1, ["MatMul", "Add"]),
    ((2, 3, 4), (2, 3, 5), False, 1, ["MatMul"]),
    ((2, 3, 4), (2, 3, 5), True, 0, ["MatMul", "Add"]),
    ((2, 3, 4), (2, 3, 5, 1), True, 1, ["MatMul", "Add", "Reshape"]),  # a Linear then a head split
    ((2, 3, 2, 2), (2, 3, 5), True, 1, ["Reshape", "MatMul", "Add"]),  # merged heads then a Linear
])
def test_linear_on_nd_input_becomes_matmul_add(x_shape, out_shape, bias, trans_b, ops):
    nodes, inputs, inits = linear(x_shape, 6, out_shape, bias, trans_b)
    check_pass(nodes, inputs, ["y"], inits, optimize, ops)


def test_linear_with_scaled_bias_folds_beta():
    nodes, inputs, inits = linear((2, 3, 4), 6, (2, 3, 5), beta=0.5)
    check_pass(nodes, inputs, ["y"], inits, optimize, ["MatMul", "Add"])


@pytest.mark.parametrize("why", ["alpha", "shared", "2-d"])
def test_linear_left_alone(why):
    if why == "2-d":
        nodes, inputs, inits = linear((6, 4), 6, (6, 5))
        nodes = nodes[1:2]
        nodes[0].input[0] = "x"
        nodes[0].output[0] = "y"
        check_pass(nodes, inputs, ["y"], inits, optimize, ["Gemm"])
        return
    nodes, inputs, inits = linear((2, 3, 4), 6, (2, 3, 5), alpha=2.0 if why == "alpha" else 1.0)
    outputs = ["y", "g"] if why == "shared" else ["y"]
    check_pass(nodes, inputs, outputs, inits, optimize, ["Reshape", "Gemm", "Reshape"])


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(1, 3), min_size=2, max_size=3), k=st.integers(1, 5), m=st.integers(1, 5),
       bias=st.booleans(), trans_b=st.integers(0, 1))
def test_generated_linears_compute_the_same(lead, k, m, bias, trans_b):
    rows = math.prod(lead)
    nodes, inputs, inits = linear((*lead, k), rows, (*lead, m), bias, trans_b)
    graph = check_pass(nodes, inputs, ["y"], inits, optimize, ["MatMul", "Add"] if bias else ["MatMul"])
    assert graph.value(graph.nodes[0].outputs[0]).shape == (*lead, m)


def test_batched_matmul_through_merged_batch_dims_becomes_one_matmul():
    nodes = [node("Reshape", ["a", "sa"], ["ra"]), node("Reshape", ["b", "sb"], ["rb"]),
             node("MatMul", ["ra", "rb"], ["p"]), node("Reshape", ["p", "sy"], ["y"])]
    inputs = {"a": ((2, 3, 4, 5), F), "b": ((2, 3, 5, 6), F)}
    inits = {"sa": i64(6, 4, 5), "sb": i64(6, 5, 6), "sy": i64(2, 3, 4, 6)}
    graph = check_pass(nodes, inputs, ["y"], inits, optimize, ["MatMul"])
    assert graph.nodes[0].inputs == ["a", "b"]


def test_batched_matmul_with_other_batch_dims_left_alone():
    nodes = [node("Reshape", ["a", "sa"], ["ra"]), node("Reshape", ["b", "sb"], ["rb"]),
             node("MatMul", ["ra", "rb"], ["p"]), node("Reshape", ["p", "sy"], ["y"])]
    inputs = {"a": ((2, 3, 4, 5), F), "b": ((3, 2, 5, 6), F)}  # the same count of batches, another order
    inits = {"sa": i64(6, 4, 5), "sb": i64(6, 5, 6), "sy": i64(2, 3, 4, 6)}
    check_pass(nodes, inputs, ["y"], inits, optimize, ["Reshape", "Reshape", "MatMul", "Reshape"])


# ---- GELU ----------------------------------------------------------------------------------------------
X = {"x": ((2, 3, 4), F)}
SCALED = {"div": node("Div", ["x", "sqrt2"], ["s"]), "mul": node("Mul", ["x", "rsqrt2"], ["s"])}
GELU_CONSTS = {"sqrt2": np.float32(math.sqrt(2)), "rsqrt2": np.float32(math.sqrt(0.5)),
               "one": np.float32(1), "half": np.float32(0.5)}


@pytest.mark.parametrize("scaled", ["div", "mul"])
@pytest.mark.parametrize("order", ["torch.onnx", "half-first", "x-last", "one-first"])
def test_erf_gelu_in_any_order_becomes_gelu(scaled, order):
    one_plus = node("Add", ["one", "e"] if order == "one-first" else ["e", "one"], ["p"])
    products = {
        "torch.onnx": [node("Mul", ["x", "p"], ["q"]), node("Mul", ["q", "half"], ["y"])],
        "one-first": [node("Mul", ["x", "p"], ["q"]), node("Mul", ["q", "half"], ["y"])],
        "half-first": [node("Mul", ["half", "x"], ["q"]), node("Mul", ["q", "p"], ["y"])],
        "x-last": [node("Mul", ["p", "half"], ["q"]), node("Mul", ["q", "x"], ["y"])],
    }[order]
    nodes = [SCALED[scaled], node("Erf", ["s"], ["e"]), one_plus, *products]
    graph = check_pass(nodes, X, ["y"], GELU_CONSTS, optimize, ["Gelu"])
    assert graph.nodes[0].inputs == ["x"] and graph.nodes[0].attrs == {"approximate": "none"}


@pytest.mark.parametrize("change", ["other-half", "erf-of-other", "read-twice"])
def test_near_gelu_left_alone(change):
    consts = {**GELU_CONSTS, "half": np.float32(0.4 if change == "other-half" else 0.5)}
    nodes = [node("Div", ["z" if change == "erf-of-other" else "x", "sqrt2"], ["s"]), node("Erf", ["s"], ["e"]),
             node("Add", ["e", "one"], ["p"]), node("Mul", ["x", "p"], ["q"]), node("Mul", ["q", "half"], ["y"])]
    inputs = {**X, "z": ((2, 3, 4), F)}
    outputs = ["y", "e"] if change == "read-twice" else ["y"]
    graph = check_pass(nodes, inputs, outputs, consts, optimize, ["Div", "Erf", "Add", "Mul", "Mul"])
    assert "Gelu" not in [n.op for n in graph]


def test_commutative_ops_read_their_constant_second():
    nodes = [node("Add", ["b", "x"], ["a"]), node("Mul", ["c", "a"], ["y"])]
    graph = check_pass(nodes, X, ["y"], {"b": w(4), "c": w(3, 4)}, optimize, ["Add", "Mul"])
    assert [n.inputs[0] for n in graph] == ["x", "a"]


def test_users_add_their_own_rewrite():
    def double_negation(uses, n: Node):
        inner = uses.inner(n.inputs[0])
        return [Node("Relu", n.name, [inner.inputs[0]], list(n.outputs))] if inner and inner.op == "Neg" else None

    model = make_model([node("Neg", ["x"], ["n"]), node("Neg", ["n"], ["r"]), node("Relu", ["r"], ["y"])], X, ["y"])
    graph = canonicalize(import_onnx(model), (*REWRITES, Rewrite("double-negation", "Neg", double_negation)))
    assert [(n.op, n.inputs) for n in graph] == [("Relu", ["x"]), ("Relu", [graph.nodes[0].outputs[0]])]


def test_a_reshape_that_does_more_than_merge_batch_dims_is_left_alone():
    """(2, 3, 4, 5) -> (6, 5, 4) keeps the element count and the batch but is no plain merge: the MatMul reads
    another matrix than `a`'s last two dimensions, so the pattern must not fire."""
    nodes = [node("Reshape", ["a", "sa"], ["ra"]), node("Reshape", ["b", "sb"], ["rb"]),
             node("MatMul", ["ra", "rb"], ["p"]), node("Reshape", ["p", "sy"], ["y"])]
    inputs = {"a": ((2, 3, 4, 5), F), "b": ((2, 3, 4, 6), F)}
    inits = {"sa": i64(6, 5, 4), "sb": i64(6, 4, 6), "sy": i64(2, 3, 5, 6)}
    check_pass(nodes, inputs, ["y"], inits, optimize, ["Reshape", "Reshape", "MatMul", "Reshape"])
