"""ComputeDAG analyses (order, producers/consumers, FLOPs, workload keys, sketch predicates) and the
index simplifier that keeps division out of generated inner loops."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tensorgen import te
from tensorgen.build import build
from tensorgen.dag import ComputeDAG
from tensorgen.loopir.simplify import bound, prove, simplify
from tensorgen.schedule import State
from tensorgen.schedule.lower import lower
from tensorgen.te.expr import BinOp, Var, walk


def gmm(m, n, k, relu=False):
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    kk = te.reduce_axis(k, "k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, kk] * b[kk, j], axis=kk), name="C")
    if not relu:
        return ComputeDAG([a, b, c])
    d = te.compute((m, n), lambda i, j: te.max_expr(c[i, j], 0.0), name="relu")
    return ComputeDAG([a, b, d])


def conv2d_nhwc(n, h, w, ci, co, kh, kw, pad):
    x = te.placeholder((n, h, w, ci), name="X")
    wt = te.placeholder((kh, kw, ci, co), name="W")
    hp, wp = h + 2 * pad, w + 2 * pad
    p = te.compute(
        (n, hp, wp, ci),
        lambda b, y, z, c: te.select(
            te.all_of(y >= pad, y < h + pad, z >= pad, z < w + pad), x[b, y - pad, z - pad, c], 0.0
        ),
        name="pad",
    )
    rh, rw, rc = te.reduce_axis(kh, "rh"), te.reduce_axis(kw, "rw"), te.reduce_axis(ci, "rc")
    out = te.compute(
        (n, hp - kh + 1, wp - kw + 1, co),
        lambda b, y, z, o: te.sum(p[b, y + rh, z + rw, rc] * wt[rh, rw, rc, o], axis=[rh, rw, rc]),
        name="conv",
    )
    return ComputeDAG([x, wt, out])


def norm(m, k):
    x = te.placeholder((m, k), name="X")
    ri, rk = te.reduce_axis(m, "ri"), te.reduce_axis(k, "rk")
    sq = te.compute((1,), lambda z: te.sum(x[ri, rk] * x[ri, rk], axis=[ri, rk]), name="SQ")
    out = te.compute((1,), lambda z: te.sqrt(sq[z]), name="NRM")
    return ComputeDAG([x, out])


# ---------------------------------------------------------------------------------------------
# structure


def test_topological_order_inputs_outputs():
    dag = gmm(8, 8, 8, relu=True)
    names = [t.name for t in dag.tensors]
    assert names == ["A", "B", "C", "relu"]
    assert [t.name for t in dag.inputs] == ["A", "B"]
    assert [t.name for t in dag.outputs] == ["relu"]
    assert [t.name for t in dag.args] == ["A", "B", "relu"]
    assert [t.name for t in dag.compute_tensors] == ["C", "relu"]
    for t in dag.compute_tensors:
        for prod in dag.producers[t.name]:
            assert names.index(prod) < names.index(t.name)


def test_topological_order_diamond():
    x = te.placeholder((4,), name="x")
    a = te.compute((4,), lambda i: x[i] + 1.0, name="a")
    b = te.compute((4,), lambda i: a[i] * 2.0, name="b")
    c = te.compute((4,), lambda i: a[i] - x[i], name="c")
    d = te.compute((4,), lambda i: b[i] + c[i], name="d")
    dag = ComputeDAG(d)
    names = [t.name for t in dag.tensors]
    pos = {n: k for k, n in enumerate(names)}
    assert pos["x"] < pos["a"] < pos["b"] < pos["d"] and pos["a"] < pos["c"] < pos["d"]
    assert set(dag.consumers["a"]) == {"b", "c"}
    assert set(dag.consumers["x"]) == {"a", "c"}
    assert dag.consumers["d"] == ()
    assert set(dag.producers["d"]) == {"b", "c"}
    assert dag.producers["x"] == ()
    assert dag.is_output("d") and not dag.is_output("a")


def test_consumers_producers_gmm_relu():
    dag = gmm(8, 8, 8, relu=True)
    assert dag.consumers["A"] == ("C",) and dag.consumers["B"] == ("C",)
    assert dag.consumers["C"] == ("relu",)
    assert set(dag.producers["C"]) == {"A", "B"}
    assert dag.producers["relu"] == ("C",)


def test_duplicate_names_are_made_unique():
    x = te.placeholder((4,), name="t")
    a = te.compute((4,), lambda i: x[i] + 1.0, name="t")
    b = te.compute((4,), lambda i: a[i] * 2.0, name="t")
    dag = ComputeDAG(b)
    names = [t.name for t in dag.tensors]
    assert len(set(names)) == 3
    f = build(dag)
    (out,) = f.run(np.arange(4, dtype="float32"))
    np.testing.assert_allclose(out, (np.arange(4) + 1.0) * 2.0)


# ---------------------------------------------------------------------------------------------
# flops and workload keys


@pytest.mark.parametrize("m, n, k", [(1024, 1024, 1024), (24, 40, 16), (1, 7, 3)])
def test_flop_count_gmm(m, n, k):
    assert gmm(m, n, k).flop_count == 2 * m * n * k


def test_flop_count_conv2d():
    n, h, w, ci, co, kh, kw = 1, 14, 14, 16, 32, 3, 3
    dag = conv2d_nhwc(n, h, w, ci, co, kh, kw, pad=1)
    # the padding stage's comparisons are integer (index) math and cost nothing
    assert dag.flop_count == 2 * n * h * w * co * ci * kh * kw


def test_workload_key_stable_and_distinct():
    k1, k2 = gmm(16, 32, 8).workload_key, gmm(16, 32, 8).workload_key
    assert k1 == k2 and isinstance(k1, str) and len(k1) >= 16
    assert gmm(16, 32, 9).workload_key != k1
    assert gmm(32, 16, 8).workload_key != k1
    assert gmm(16, 32, 8, relu=True).workload_key != k1
    assert conv2d_nhwc(1, 6, 6, 4, 8, 3, 3, 1).workload_key == conv2d_nhwc(1, 6, 6, 4, 8, 3, 3, 1).workload_key
    assert conv2d_nhwc(1, 6, 6, 4, 8, 3, 3, 1).workload_key != conv2d_nhwc(1, 6, 6, 4, 8, 3, 3, 0).workload_key


def test_workload_key_independent_of_names():
    a = te.placeholder((4, 3), name="Left")
    b = te.placeholder((3, 5), name="Right")
    r = te.reduce_axis(3, "r")
    c = te.compute((4, 5), lambda x, y: te.sum(a[x, r] * b[r, y], axis=r), name="Out")
    assert ComputeDAG([a, b, c]).workload_key == gmm(4, 5, 3).workload_key


def test_workload_key_stable_across_processes():
    code = textwrap.dedent(
        """
        from tensorgen import te
        from tensorgen.dag import ComputeDAG
        a = te.placeholder((16, 8), name="A")
        b = te.placeholder((8, 32), name="B")
        kk = te.reduce_axis(8, "k")
        c = te.compute((16, 32), lambda i, j: te.sum(a[i, kk] * b[kk, j], axis=kk), name="C")
        print(ComputeDAG([a, b, c]).workload_key)
        """
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == gmm(16, 32, 8).workload_key


# ---------------------------------------------------------------------------------------------
# sketch-rule predicates


def test_predicates_gmm_relu_conv():
    dag = gmm(16, 16, 16, relu=True)
    assert dag.is_strict_inlinable("relu") is True
    assert dag.is_strict_inlinable("C") is False
    assert dag.is_strict_inlinable("A") is False
    assert dag.has_data_reuse("C") is True
    assert dag.has_data_reuse("relu") is False
    assert dag.fusible_consumer("C") == "relu"
    assert dag.has_fusible_consumer("C")
    assert dag.fusible_consumer("relu") is None  # an output has no consumer
    conv = conv2d_nhwc(1, 6, 6, 4, 8, 3, 3, 1)
    assert conv.is_strict_inlinable("pad") is False  # a select is a branch
    assert conv.has_data_reuse("conv") is True
    assert conv.fusible_consumer("pad") is None  # read at shifted indices, by a reduction


def test_is_strict_inlinable_expensive_intrinsic():
    x = te.placeholder((4,), name="x")
    e = te.compute((4,), lambda i: te.exp(x[i]), name="e")
    a = te.compute((4,), lambda i: x[i] * 2.0 + 1.0, name="a")
    out = te.compute((4,), lambda i: e[i] + a[i], name="out")
    dag = ComputeDAG(out)
    assert dag.is_strict_inlinable("e") is False
    assert dag.is_strict_inlinable("a") is True
    assert dag.is_injective("e") and dag.is_injective("a")


def test_needs_rfactor():
    nrm = norm(256, 256)
    assert nrm.space_and_reduce_length("SQ") == (1, 256 * 256)
    assert nrm.needs_rfactor("SQ", num_cores=2) is True
    assert nrm.has_more_reduction_parallel("SQ")
    assert nrm.needs_rfactor("NRM", num_cores=2) is False  # no reduction at all
    big = gmm(1024, 1024, 1024)
    assert big.needs_rfactor("C", num_cores=2) is False
    assert not big.has_more_reduction_parallel("C")
    # a tiny-space, long-reduction GMM does want rfactor
    assert gmm(1, 1, 4096).needs_rfactor("C", num_cores=2) is True


# ---------------------------------------------------------------------------------------------
# simplifier


def _vars():
    i, j = Var("i", "int32", 16), Var("j", "int32", 8)
    return i, j, {i: (0, 15), j: (0, 7)}


def test_simplify_div_mod_of_split_index():
    i, j, ranges = _vars()
    e = i * 8 + j
    assert simplify(e // 8, ranges) == i
    assert simplify(e % 8, ranges) == j
    assert simplify((j + i * 8) // 8, ranges) == i
    assert simplify((i * 16 + j * 2) // 2, ranges) == simplify(i * 8 + j, ranges)
    assert simplify((i * 8 + j) // 16, ranges) != i  # not provable: must stay a division
    # with an unbounded j the division must stay
    u = Var("u", "int32")
    assert any(isinstance(n, BinOp) and n.op == "floordiv" for n in walk(simplify((i * 8 + u) // 8, ranges)))
    assert any(isinstance(n, BinOp) and n.op == "floormod" for n in walk(simplify((i * 8 + u) % 8, ranges)))


def test_simplify_linear_and_constants():
    i, j, ranges = _vars()
    assert simplify(i + j - j, ranges) == i
    assert simplify((i + 1) * 2 - 2, ranges) == simplify(i * 2, ranges)
    assert simplify(j // 8, ranges).value == 0
    assert simplify(j % 8, ranges) == j
    assert simplify(te.min_expr(j, 100), ranges) == j
    assert simplify(te.min_expr(100, j), ranges) == j
    assert simplify(te.min_expr(j, -1), ranges).value == -1


def test_simplify_max_with_disjoint_ranges():
    i, j, ranges = _vars()
    assert simplify(te.max_expr(j, 100), ranges).value == 100  # j in [0, 7]: max is 100, got j
    assert simplify(te.max_expr(100, j), ranges).value == 100
    assert simplify(te.max_expr(j, -1), ranges) == j


def test_clamped_index_with_max_is_not_miscompiled():
    i, j, ranges = _vars()
    e = te.max_expr(j - 1, 0)  # j - 1 in [-1, 6]: not decidable, must stay a max
    assert any(isinstance(n, BinOp) and n.op == "max" for n in walk(simplify(e, ranges)))
    x = te.placeholder((8,), name="X")
    y = te.compute((8,), lambda k: x[te.max_expr(k - 1, 0)], name="Y")
    xs = np.arange(8, dtype="float32")
    (out,) = build([x, y]).run(xs)
    np.testing.assert_array_equal(out, xs[np.maximum(np.arange(8) - 1, 0)])


def test_bound_and_prove():
    i, j, ranges = _vars()
    assert bound(i * 8 + j, ranges) == (0, 127)
    assert bound(i - j, ranges) == (-7, 15)
    assert bound((i * 8 + j) // 8, ranges) == (0, 15)
    assert prove(i * 8 + j < 128, ranges) is True
    assert prove(i * 8 + j >= 128, ranges) is False
    assert prove(i * 8 + j < 100, ranges) is None
    assert prove(te.all_of(j < 8, i >= 0), ranges) is True


def _innermost_loop_bodies(src: str) -> list[str]:
    """The text of every innermost `for` body in C source."""
    bodies = []
    lines = src.splitlines()
    for n, line in enumerate(lines):
        if line.strip().startswith("for ("):
            depth, body = 0, []
            for inner in lines[n:]:
                depth += inner.count("{") - inner.count("}")
                body.append(inner)
                if depth <= 0:
                    break
            text = "\n".join(body[1:])
            if "for (" not in text:
                bodies.append(text)
    return bodies


def test_split_schedule_has_no_division_in_inner_loop():
    dag = gmm(32, 24, 16, relu=True)
    s = State(dag)
    s.split("C", "i", [4, 2])
    s.split("C", "j", [8])
    s.split("C", "k", [4])
    s.reorder("C", ["i_0", "j_0", "k_0", "i_1", "k_1", "i_2", "j_1"])
    s.split("relu", "i", [8])
    s.split("relu", "j", [8])
    s.reorder("relu", ["i_0", "j_0", "i_1", "j_1"])
    f = build(s)
    bodies = _innermost_loop_bodies(f.source)
    assert bodies
    for body in bodies:
        code = re.sub(r"/\*.*?\*/", "", body)
        assert "/" not in code and "%" not in code, body
    a = np.random.default_rng(0).uniform(-1, 1, (32, 16)).astype("float32")
    b = np.random.default_rng(1).uniform(-1, 1, (16, 24)).astype("float32")
    (out,) = f.run(a, b)
    np.testing.assert_allclose(out, np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)


def test_fused_loop_index_is_simplified_in_lowered_ir():
    dag = gmm(8, 8, 4, relu=True)
    s = State(dag)
    s.split("relu", "j", [8])  # j_0 has extent 1: j is just j_1
    s.fuse("relu", ["i", "j_0"])
    text = s.to_loops()
    assert "i_j_0_f" in text
    body = lower(s).body
    assert body is not None


def test_workload_key_sees_combiner_init_where_tag_attrs_dtype_constants():
    def key(comb=te.sum, init=None, where=None, tag="", attrs=None, dtype="float32", scale=1.0):
        x = te.placeholder((4, 8), dtype=dtype, name="x")
        k = te.reduce_axis(8, "k")
        y = te.compute(
            (4,),
            lambda i: comb(x[i, k] * scale, axis=k, init=init, where=(k < where) if where else None),
            name="y", tag=tag, attrs=attrs,
        )
        return ComputeDAG(y).workload_key

    keys = [key(), key(te.max), key(init=1.0), key(where=3), key(tag="t"), key(attrs={"a": 1}),
            key(dtype="float64"), key(scale=0.5), key(scale=0.5000001)]
    assert len(set(keys)) == len(keys)
    assert key(scale=0.5) == key(scale=0.5)


def test_heap_buffers_outside_parallel_loops_share_the_module_scratch():
    """render_module(scratch=True): a root-level heap buffer is an offset into the shared scratch (sized by
    the largest function), one allocated inside a parallel loop stays a per-thread buffer."""
    from tensorgen.codegen.c import STACK_LIMIT, render_module

    n = STACK_LIMIT // 4 + 16  # past the stack limit
    a = te.placeholder((4, n), name="A")
    b = te.compute((4, n), lambda i, j: a[i, j] * 2.0, name="B")
    c = te.compute((4, n), lambda i, j: b[i, j] + 1.0, name="C")
    root = State(ComputeDAG(c))  # B at root: one buffer of 4n floats outside any loop
    inner = State(ComputeDAG(c))
    inner.parallel("C", "i")
    inner.compute_at("B", "C", "i")  # B per row, inside the parallel loop
    source = render_module([lower(root, "root_f"), lower(inner, "inner_f")], scratch=True)
    assert "return (float*)(tensorgen_scratch + 0);" in source
    assert f"#define TENSORGEN_SCRATCH_BYTES {-(-4 * n * 4 // 64) * 64}" in source
    assert source.count("static __thread float* buffer;") == 1  # inner_f's row buffer, per thread
