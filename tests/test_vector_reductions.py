"""Innermost reductions into one element become vectors of partial results (codegen.vector.try_emit_reduction):
sums, maxima and minima of every length, dtype and NaN case against NumPy, and the loops it must leave alone."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgen import te
from tensorgen.build import build
from tensorgen.schedule import State

REDUCERS = {"sum": (te.sum, np.sum), "max": (te.max, np.max), "min": (te.min, np.min)}


def row_reduce(op: str, rows: int, width: int, dtype: str = "float32"):
    x = te.placeholder((rows, width), name="x", dtype=dtype)
    k = te.reduce_axis(width, "k")
    out = te.compute((rows,), lambda i: REDUCERS[op][0](x[i, k] * 2.0, axis=k), name="out")
    return x, out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [4, 7, 16, 37, 128, 200])
@pytest.mark.parametrize("op", list(REDUCERS))
def test_row_reductions_match_numpy(op, width, dtype):
    x, out = row_reduce(op, 5, width, dtype)
    f = build(State([x, out]))
    a = np.random.default_rng(width).uniform(-3, 3, (5, width)).astype(dtype)
    (got,) = f.run(a)
    np.testing.assert_allclose(got, REDUCERS[op][1](a * 2.0, axis=1), rtol=1e-5, atol=1e-5)
    assert (f"{op if op != 'sum' else 'add'}_lanes_" in f.source) == (width >= 4), f.source


@pytest.mark.parametrize("op", ["max", "min"])
def test_nan_anywhere_in_a_row_gives_nan(op):
    x, out = row_reduce(op, 40, 37)
    a = np.random.default_rng(0).uniform(-1, 1, (40, 37)).astype("float32")
    for row in range(37):
        a[row, row] = np.nan  # in a vector's first lane, a later lane, the scalar rest
    (got,) = build(State([x, out])).run(a)
    assert np.isnan(got[:37]).all() and not np.isnan(got[37:]).any()
    np.testing.assert_allclose(got[37:], REDUCERS[op][1](a[37:] * 2.0, axis=1))


def test_variance_with_a_broadcast_mean_and_a_vectorize_annotation():
    x = te.placeholder((6, 50), name="x")
    k = te.reduce_axis(50, "k")
    total = te.compute((6,), lambda i: te.sum(x[i, k], axis=k), name="total")
    k2 = te.reduce_axis(50, "k2")
    var = te.compute((6,), lambda i: te.sum((x[i, k2] - total[i] / 50.0) * (x[i, k2] - total[i] / 50.0), axis=k2),
                     name="var")
    s = State([x, var])
    s.vectorize("var", "k2")  # an annotated reduce loop takes the same path
    f = build(s)
    a = np.random.default_rng(1).normal(5, 2, (6, 50)).astype("float32")
    (got,) = f.run(a)
    np.testing.assert_allclose(got, ((a - a.mean(1, keepdims=True)) ** 2).sum(1), rtol=1e-4)
    assert f.source.count("add_lanes_") >= 2


def test_strided_and_integer_reductions_stay_scalar():
    x = te.placeholder((64, 8), name="x")
    k = te.reduce_axis(64, "k")
    cols = te.compute((8,), lambda j: te.sum(x[k, j], axis=k), name="cols")  # stride 8 along k
    n = te.placeholder((4, 32), name="n", dtype="int32")
    k2 = te.reduce_axis(32, "k2")
    ints = te.compute((4,), lambda i: te.sum(n[i, k2], axis=k2), name="ints")
    for tensors, arg, axis in (([x, cols], np.arange(512, dtype="float32").reshape(64, 8), 0),
                               ([n, ints], np.arange(128, dtype="int32").reshape(4, 32), 1)):
        f = build(State(tensors))
        (got,) = f.run(arg)
        np.testing.assert_array_equal(got, arg.sum(axis))
        assert "_lanes_" not in f.source
