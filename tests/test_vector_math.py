"""Vectorized exp and sigmoid (codegen.vector: libmvec's exp, its lanes below the normal range given 0 without its
slow scalar path) against NumPy over every range: huge negatives (a causal mask's finfo.min), the edge of the normal
and denormal ranges, overflow, infinities and NaN."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgen import te
from tensorgen.build import build
from tensorgen.codegen.toolchain import has_vector_math
from tensorgen.schedule import State

EDGES = [-np.inf, -1e30, -1e4, -800.0, -746.0, -745.0, -708.5, -708.0, -120.0, -104.0, -103.0, -100.0, -88.0, -87.5,
         -87.0, -86.9, -50.0, -1.0, -0.0, 0.0, 1e-3, 1.0, 50.0, 87.0, 88.0, 88.8, 100.0, 709.0, 710.0, 1e4, np.inf,
         np.nan]
REFERENCE = {"exp": np.exp, "sigmoid": lambda a: 1 / (1 + np.exp(-a))}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fn", ["exp", "sigmoid"])
def test_vector_exp_and_sigmoid_over_every_range(fn, dtype):
    x = te.placeholder((3, 40), name="x", dtype=dtype)
    y = te.compute((3, 40), lambda i, j: getattr(te, fn)(x[i, j]), name="y")
    s = State([x, y])
    s.vectorize("y", "j")
    f = build(s, simd_bytes=32)  # AVX2's width, which every x86-64 machine CI runs on has
    a = np.random.default_rng(0).uniform(-20, 20, (3, 40)).astype(dtype)
    a.flat[:len(EDGES)] = EDGES
    a[1, ::3] = np.finfo(dtype).min  # a masked row: every lane position, vector and scalar rest
    with np.errstate(over="ignore", under="ignore"):
        want = REFERENCE[fn](a.astype(np.float64)).astype(dtype)
    (got,) = f.run(a)
    assert (np.isnan(got) == np.isnan(want)).all()
    tiny = np.finfo(dtype).tiny  # results under the smallest normal number may be flushed to 0
    np.testing.assert_allclose(got, want, rtol=4e-7 if dtype == "float32" else 1e-14, atol=tiny)
    assert (got[1, ::3] == 0.0).all()
    if has_vector_math(32, "exp"):  # the vector path was taken (else the scalar one, checked all the same)
        assert f"exp_{'float8' if dtype == 'float32' else 'double4'}(" in f.source, f.source
