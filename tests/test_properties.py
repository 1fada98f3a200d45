"""Property tests: random valid schedules compute what the naive program computes.

Hypothesis draws step sequences (splits by divisors and non-divisors, reorders, fusion, parallel,
vectorize, unroll, compute_at at a random consumer loop, cache_write, inlining) on a matmul+relu
and a small NHWC conv2d; every generated program must match the naive program's output, and the JSON
round trip must be the identity. Set TENSORGEN_PROPERTY_EXAMPLES to explore more.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorgen import te
from tensorgen.build import build
from tensorgen.schedule import State

EXAMPLES = int(os.environ.get("TENSORGEN_PROPERTY_EXAMPLES", "25"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

pytestmark = pytest.mark.timeout(max(60, EXAMPLES * 3))




# ---------------------------------------------------------------------------------------------
# workloads, built once; their naive outputs are the references


M, N, K = 24, 40, 16
MA = te.placeholder((M, K), name="A")
MB = te.placeholder((K, N), name="B")
_k = te.reduce_axis(K, "k")
MC = te.compute((M, N), lambda i, j: te.sum(MA[i, _k] * MB[_k, j], axis=_k), name="C")
MD = te.compute((M, N), lambda i, j: te.max_expr(MC[i, j], 0.0), name="D")
_rng = np.random.default_rng(0)
MATMUL_INPUTS = [_rng.uniform(-1, 1, (M, K)).astype("float32"), _rng.uniform(-1, 1, (K, N)).astype("float32")]

CB, CH, CW, CI, CO, KS, PAD = 1, 5, 6, 3, 4, 3, 1
CX = te.placeholder((CB, CH, CW, CI), name="X")
CWt = te.placeholder((KS, KS, CI, CO), name="W")
CP = te.compute(
    (CB, CH + 2 * PAD, CW + 2 * PAD, CI),
    lambda n, h, w, c: te.select(
        te.all_of(h >= PAD, h < CH + PAD, w >= PAD, w < CW + PAD), CX[n, h - PAD, w - PAD, c], 0.0
    ),
    name="pad",
)
_rh, _rw, _rc = te.reduce_axis(KS, "rh"), te.reduce_axis(KS, "rw"), te.reduce_axis(CI, "rc")
CY = te.compute(
    (CB, CH, CW, CO),
    lambda n, h, w, co: te.sum(CP[n, h + _rh, w + _rw, _rc] * CWt[_rh, _rw, _rc, co], axis=[_rh, _rw, _rc]),
    name="conv",
)
CONV_INPUTS = [_rng.uniform(-1, 1, (CB, CH, CW, CI)).astype("float32"),
               _rng.uniform(-1, 1, (KS, KS, CI, CO)).astype("float32")]

_REFERENCE: dict[str, np.ndarray] = {}


def reference(key: str, tensors, inputs) -> np.ndarray:
    """The naive program's output (checked against NumPy once)."""
    if key not in _REFERENCE:
        (out,) = build(State(tensors)).run(*inputs)
        _REFERENCE[key] = out
    return _REFERENCE[key]


def test_naive_programs_match_numpy():
    a, b = MATMUL_INPUTS
    np.testing.assert_allclose(reference("matmul", [MA, MB, MD], MATMUL_INPUTS), np.maximum(a @ b, 0),
                               rtol=1e-4, atol=1e-4)
    x, w = CONV_INPUTS
    xp = np.pad(x, ((0, 0), (PAD, PAD), (PAD, PAD), (0, 0)))
    ref = sum(np.einsum("nhwc,co->nhwo", xp[:, a:a + CH, b:b + CW, :], w[a, b])
              for a in range(KS) for b in range(KS))
    np.testing.assert_allclose(reference("conv", [CX, CWt, CY], CONV_INPUTS), ref, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# random schedule building blocks; each draws only valid steps for the current state


def draw_split(data, s: State, stage: str, it: str, max_parts: int = 2) -> None:
    extent = s.stage(stage).iters[s.stage(stage).iter_index(it)].extent
    if extent <= 1:
        return
    parts = data.draw(st.integers(1, max_parts), label=f"parts {stage}.{it}")
    lengths: list[int] = []
    left = extent
    for _ in range(parts):
        if left <= 1:
            break
        divisors = [d for d in range(2, left + 1) if left % d == 0]
        choice = data.draw(st.one_of(st.sampled_from(divisors), st.integers(1, left)), label="length")
        lengths.append(choice)
        left //= choice
    if not lengths:
        return
    inner_to_outer = data.draw(st.booleans(), label="inner_to_outer")
    s.split(stage, it, lengths, inner_to_outer=inner_to_outer)


def draw_reorder(data, s: State, stage: str) -> None:
    names = [i.name for i in s.stage(stage).iters]
    s.reorder(stage, data.draw(st.permutations(names), label=f"reorder {stage}"))


def draw_annotations(data, s: State, stage: str, allow_parallel: bool = True) -> None:
    its = s.stage(stage).iters
    if allow_parallel and its[0].kind == "spatial" and data.draw(st.booleans(), label="parallel"):
        s.parallel(stage, its[0].name)
    its = s.stage(stage).iters
    last = its[-1]
    if len(its) > 1 and last.kind == "spatial" and last.annotation == "none" and data.draw(st.booleans(),
                                                                                            label="vectorize"):
        s.vectorize(stage, last.name)
    its = s.stage(stage).iters
    free = [i.name for i in its if i.annotation == "none" and i.extent <= 16]
    if free and data.draw(st.booleans(), label="unroll"):
        s.unroll(stage, data.draw(st.sampled_from(free), label="unroll iter"))


def draw_fuse_outer(data, s: State, stage: str) -> None:
    its = s.stage(stage).iters
    if len(its) >= 2 and its[0].kind == its[1].kind == "spatial" and data.draw(st.booleans(), label="fuse"):
        s.fuse(stage, [its[0].name, its[1].name])


def draw_location(data, s: State, stage: str, consumer: str) -> None:
    """Leave at root, or compute at a random loop of its consumer."""
    where = data.draw(st.sampled_from(["root", "at"]), label=f"location {stage}")
    if where == "at":
        its = [i.name for i in s.stage(consumer).iters]
        s.compute_at(stage, consumer, data.draw(st.sampled_from(its), label=f"{stage} at {consumer}"))


def check_program(s: State, inputs, expected) -> None:
    text = s.to_json()
    again = State.from_json(s.dag, text)
    assert again == s
    assert again.to_json() == text
    f = build(s)
    (out,) = f.run(*inputs)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4, err_msg=f"{s}\n{f.source}")
    replay = State(s.dag)
    exec(str(s), {}, {"s": replay})  # noqa: S102 - the printed program is runnable by design
    assert replay == s


# ---------------------------------------------------------------------------------------------
# properties


@SETTINGS
@given(st.data())
def test_random_matmul_relu_schedules_match_naive(data):
    expected = reference("matmul", [MA, MB, MD], MATMUL_INPUTS)
    s = State([MA, MB, MD])
    cache = data.draw(st.booleans(), label="cache_write")
    reducer = "C"
    if cache:
        s.cache_write("C", "local")
        reducer = "C_local"
    # the output stage: tiling, reorder, fusion, annotations
    for it in ("i", "j"):
        draw_split(data, s, "D", it)
    draw_reorder(data, s, "D")
    draw_fuse_outer(data, s, "D")
    # the reduction stage
    for it in ("i", "j", "k"):
        draw_split(data, s, reducer, it)
    draw_reorder(data, s, reducer)
    if cache:
        mode = data.draw(st.sampled_from(["inline", "copy_at", "root"]), label="copy stage")
        if mode == "inline":
            s.compute_inline("C")
            draw_location(data, s, "C_local", "D")
        else:
            if mode == "copy_at":
                draw_location(data, s, "C", "D")
            draw_location(data, s, "C_local", "C")
            draw_annotations(data, s, "C", allow_parallel=s.stage("C").location == "root")
    else:
        draw_location(data, s, "C", "D")
    draw_annotations(data, s, reducer, allow_parallel=s.stage(reducer).location == "root")
    draw_annotations(data, s, "D")
    check_program(s, MATMUL_INPUTS, expected)


@SETTINGS
@given(st.data())
def test_random_conv2d_schedules_match_naive(data):
    expected = reference("conv", [CX, CWt, CY], CONV_INPUTS)
    s = State([CX, CWt, CY])
    cache = data.draw(st.booleans(), label="cache_write")
    reducer = "conv"
    if cache:
        s.cache_write("conv", "local")
        reducer = "conv_local"
        for it in ("h", "w", "co"):
            draw_split(data, s, "conv", it, max_parts=1)
        draw_reorder(data, s, "conv")
        draw_fuse_outer(data, s, "conv")
    for it in ("h", "w", "co", "rc", "rw"):
        draw_split(data, s, reducer, it, max_parts=1 if it.startswith("r") else 2)
    draw_reorder(data, s, reducer)
    pad_mode = data.draw(st.sampled_from(["inline", "at", "root"]), label="pad")
    if pad_mode == "inline":
        s.compute_inline("pad")
    elif pad_mode == "at":
        its = [i.name for i in s.stage(reducer).iters]
        s.compute_at("pad", reducer, data.draw(st.sampled_from(its), label="pad at"))
    else:
        draw_split(data, s, "pad", "w", max_parts=1)
        draw_annotations(data, s, "pad")
    if cache:
        draw_location(data, s, "conv_local", "conv")
        draw_annotations(data, s, "conv")
    draw_annotations(data, s, reducer, allow_parallel=s.stage(reducer).location == "root")
    check_program(s, CONV_INPUTS, expected)


@SETTINGS
@given(st.data())
def test_random_rfactor_schedules_match_naive(data):
    expected = reference("matmul", [MA, MB, MD], MATMUL_INPUTS)
    s = State([MA, MB, MD])
    factor = data.draw(st.integers(2, K), label="k factor")
    s.split("C", "k", [factor])
    which = data.draw(st.sampled_from(["k_0", "k_1"]), label="rfactor iter")
    s.rfactor("C", which, data.draw(st.integers(0, 2), label="factor_iter_id"))
    draw_reorder(data, s, "C_rf")
    draw_annotations(data, s, "C_rf")
    draw_location(data, s, "C", "D")
    draw_annotations(data, s, "D")
    check_program(s, MATMUL_INPUTS, expected)
