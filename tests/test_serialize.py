"""ComputeDAG JSON round trips: same workload key and canonical text, same replayed State, same C."""

from __future__ import annotations

import json
import math

import pytest

from tensorgen import te
from tensorgen.codegen.c import render_c
from tensorgen.dag import ComputeDAG
from tensorgen.dag_json import DAG_FORMAT, DagFormatError, DagVersionError, dag_from_json, dag_to_json
from tensorgen.schedule import State
from tensorgen.schedule.lower import lower
from tensorgen.te import ops
from tensorgen.te.ops import SUITE


def roundtrip(dag: ComputeDAG) -> ComputeDAG:
    text = json.dumps(dag_to_json(dag), allow_nan=False)  # strict JSON: no bare Infinity/NaN
    new = dag_from_json(json.loads(text))
    assert new.workload_key == dag.workload_key
    assert new.canonical_text == dag.canonical_text
    assert [t.name for t in new.tensors] == [t.name for t in dag.tensors]
    assert [t.name for t in new.inputs] == [t.name for t in dag.inputs]
    assert [t.name for t in new.outputs] == [t.name for t in dag.outputs]
    assert new.flop_count == dag.flop_count
    for old_t, new_t in zip(dag.tensors, new.tensors):
        assert (new_t.shape, new_t.dtype, new_t.tag, new_t.attrs) == (old_t.shape, old_t.dtype, old_t.tag, old_t.attrs)
    return new


def check_state(s: State) -> None:
    """The step list replays on the rebuilt DAG to the same program and the same generated C."""
    new_dag = roundtrip(s.dag)
    again = State.from_json(new_dag, s.to_json())
    assert again == s
    assert str(again) == str(s)
    assert again.to_loops() == s.to_loops()
    assert render_c(lower(again)) == render_c(lower(s))


def test_matmul_scheduled():
    a, b = te.placeholder((64, 48), name="A"), te.placeholder((48, 32), name="B")
    s = State([a, b, ops.matmul(a, b)])
    s.split("matmul", "i", [8, 2])
    s.split("matmul", "j", [8])
    s.reorder("matmul", ["i_0", "j_0", "i_1", "k", "i_2", "j_1"])
    s.parallel("matmul", "i_0")
    s.vectorize("matmul", "j_1")
    check_state(s)


def test_conv2d_with_pad():
    data = te.placeholder((1, 10, 10, 8), name="data")
    weight = te.placeholder((3, 3, 8, 16), name="weight")
    out = ops.relu(ops.conv2d(data, weight, stride=1, padding=1))
    s = State([data, weight, out])
    names = [t.name for t in s.dag.tensors]
    assert any("pad" in n for n in names)
    s.compute_inline(next(n for n in names if "pad" in n))
    conv = next(t.name for t in s.dag.tensors if t.tag == "conv2d")
    s.split(conv, 3, [4])
    s.parallel(conv, 0)
    check_state(s)


def test_softmax_compute_at():
    x = te.placeholder((8, 33), name="x")
    s = State([x, ops.softmax(x)])
    out = s.dag.outputs[0].name
    assert [t.name for t in s.dag.compute_tensors] == ["softmax_max", "softmax_exp", "softmax_sum", out]
    s.compute_at("softmax_max", "softmax_exp", 0)
    s.compute_at("softmax_sum", out, 0)
    s.split(out, 1, [4])
    s.parallel(out, 0)
    check_state(s)


def _smallest(configs: list[tuple[int, ...]]) -> tuple[int, ...]:
    return min(configs, key=math.prod)


@pytest.mark.parametrize("name", sorted(SUITE))
def test_suite_smallest_config(name: str):
    make, configs = SUITE[name]
    inputs, outputs = make(*_smallest(configs))
    s = State(inputs + outputs)
    stage, it = next((t.name, it.name) for t in reversed(s.dag.compute_tensors)
                     for it in s.stage(t.name).iters if it.extent > 1)  # NRM's spatial extents are all 1
    s.split(stage, it, [2])
    s.parallel(stage, 0)
    check_state(s)


def test_special_floats_and_every_node_kind():
    x = te.placeholder((4, 6), name="x")
    n = te.placeholder((4,), dtype="int64", name="n")
    k = te.reduce_axis(6, "k")
    lo = te.compute((4,), lambda i: te.max(x[i, k], axis=k, init=float("-inf")), name="lo")
    k2 = te.reduce_axis(6, "k")
    hi = te.compute((4,), lambda i: te.min(x[i, k2], axis=k2, where=k2 > 0, init=float("inf")), name="hi")
    third = te.const(1 / 3, "float64")
    y = te.compute(
        (4, 6),
        lambda i, j: te.select(
            te.any_of(te.all_of(j < 3, te.ne(i, 2)), te.logical_not(te.eq(n[i], te.const(7, "int64")))),
            te.cast(te.power(x[i, j], 2.0) + te.cast(third, "float32") * lo[i], "float64"),
            te.cast(te.select(x[i, j] > hi[i], te.const(float("nan")), te.exp(x[i, j]) + 0.1), "float64"),
        ),
        name="y",
        attrs={"pad": (1, (2, 3)), "eps": 1e-7, "big": float("inf"), "names": ["a", "b"], "nested": {"t": (4,)}},
    )
    new = roundtrip(ComputeDAG([x, n, y]))
    consts = sorted(repr(c.value) for t in new.compute_tensors for c in te_walk_consts(t.body))
    assert "-inf" in consts and "inf" in consts and "nan" in consts and repr(1 / 3) in consts and "0.1" in consts
    assert new.by_name["y"].attrs["pad"] == (1, (2, 3))
    assert math.isinf(new.by_name["y"].attrs["big"])


def te_walk_consts(expr):
    from tensorgen.te.expr import Const, walk

    return [node for node in walk(expr) if isinstance(node, Const)]


def test_input_order_not_topological():
    """The compiled function's argument order comes from the DAG, not from the traversal."""
    a, b = te.placeholder((4,), name="a"), te.placeholder((4,), name="b")
    y = te.compute((4,), lambda i: a[i] * 2.0 + b[i], name="y")
    z = te.compute((4,), lambda i: y[i] + 1.0, name="z")
    dag = ComputeDAG([z, a, b])  # the traversal from z meets b first, so stage order is b, a, y, z
    assert [t.name for t in dag.tensors] == ["b", "a", "y", "z"]
    assert [t.name for t in ComputeDAG([a, b, z]).tensors] == ["a", "b", "y", "z"]
    new = roundtrip(dag)
    assert [t.name for t in new.args] == ["a", "b", "z"]
    check_state(State(dag).parallel("z", 0))


def test_newer_and_malformed_formats():
    a = te.placeholder((4,), name="a")
    data = dag_to_json(ComputeDAG([a, te.compute((4,), lambda i: a[i] + 1.0, name="b")]))
    assert data["format"] == DAG_FORMAT
    with pytest.raises(DagVersionError, match="format version 2"):
        dag_from_json({**data, "format": DAG_FORMAT + 1})
    bad = json.loads(json.dumps(data))
    bad["tensors"][1]["body"] = ["load", 5, [["var", 0]]]
    with pytest.raises(DagFormatError, match="tensor b"):
        dag_from_json(bad)
    bad["tensors"][1]["body"] = ["frobnicate"]
    with pytest.raises(DagFormatError, match="unknown expression tag"):
        dag_from_json(bad)
    with pytest.raises(DagFormatError):
        dag_from_json({"format": 1, "tensors": [{"name": "a"}], "inputs": [0], "outputs": []})
