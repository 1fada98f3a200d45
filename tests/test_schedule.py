"""Hand-written schedules on small workloads, each compiled, run and compared against NumPy.

Every schedule also checks that the printed step program replays to an equal State, and that the
JSON round trip gives an equal State and the same generated C. Shapes are tiny so each case builds in
well under a second.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tensorgen import te
from tensorgen.build import build
from tensorgen.dag import ComputeDAG
from tensorgen.errors import ScheduleError
from tensorgen.schedule import State

RTOL = ATOL = 1e-4




def roundtrip(s: State) -> None:
    """`print(s)` replays to an equal state; JSON replays to an equal state with identical C."""
    fresh = State(s.dag)
    exec(str(s), {}, {"s": fresh})  # noqa: S102 - the printed program is meant to be executed
    assert fresh == s
    assert fresh.to_json() == s.to_json()
    again = State.from_json(s.dag, s.to_json())
    assert again == s
    assert again.to_json() == s.to_json()


def run_and_check(s: State, inputs, expected, check_roundtrip: bool = True) -> str:
    f = build(s)
    outs = f.run(*inputs)
    expected = expected if isinstance(expected, (list, tuple)) else [expected]
    assert len(outs) == len(expected)
    for got, want in zip(outs, expected):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{s}\n{f.source}")
    if check_roundtrip:
        roundtrip(s)
        assert build(State.from_json(s.dag, s.to_json())).source == f.source
    return f.source


# ---------------------------------------------------------------------------------------------
# workloads


class MatmulRelu:
    """D = relu(A @ B), with C = A @ B an intermediate stage."""

    def __init__(self, m=24, n=12, k=16, seed=0):
        self.A = te.placeholder((m, k), name="A")
        self.B = te.placeholder((k, n), name="B")
        kk = te.reduce_axis(k, "k")
        self.C = te.compute((m, n), lambda i, j: te.sum(self.A[i, kk] * self.B[kk, j], axis=kk), name="C")
        self.D = te.compute((m, n), lambda i, j: te.max_expr(self.C[i, j], 0.0), name="D")
        rng = np.random.default_rng(seed)
        self.a = rng.uniform(-1, 1, (m, k)).astype("float32")
        self.b = rng.uniform(-1, 1, (k, n)).astype("float32")
        self.ref = np.maximum(self.a @ self.b, 0)

    def state(self) -> State:
        return State([self.A, self.B, self.D])

    def check(self, s: State, **kw) -> str:
        return run_and_check(s, [self.a, self.b], self.ref, **kw)


class Matmul:
    """Plain C = A @ B (the output is the reduction itself)."""

    def __init__(self, m=16, n=12, k=20, seed=1):
        self.A = te.placeholder((m, k), name="A")
        self.B = te.placeholder((k, n), name="B")
        kk = te.reduce_axis(k, "k")
        self.C = te.compute((m, n), lambda i, j: te.sum(self.A[i, kk] * self.B[kk, j], axis=kk), name="C")
        rng = np.random.default_rng(seed)
        self.a = rng.uniform(-1, 1, (m, k)).astype("float32")
        self.b = rng.uniform(-1, 1, (k, n)).astype("float32")
        self.ref = self.a @ self.b

    def state(self) -> State:
        return State([self.A, self.B, self.C])

    def check(self, s: State, **kw) -> str:
        return run_and_check(s, [self.a, self.b], self.ref, **kw)


class Conv2dNHWC:
    """conv(n, h, w, co) = sum over rh, rw, rc of pad(n, h+rh, w+rw, rc) * W(rh, rw, rc, co)."""

    def __init__(self, batch=1, height=6, width=6, cin=4, cout=8, kernel=3, pad=1, seed=2):
        self.X = te.placeholder((batch, height, width, cin), name="X")
        self.W = te.placeholder((kernel, kernel, cin, cout), name="W")
        hp, wp = height + 2 * pad, width + 2 * pad
        self.P = te.compute(
            (batch, hp, wp, cin),
            lambda n, h, w, c: te.select(
                te.all_of(h >= pad, h < height + pad, w >= pad, w < width + pad),
                self.X[n, h - pad, w - pad, c],
                0.0,
            ),
            name="pad",
        )
        rh, rw, rc = te.reduce_axis(kernel, "rh"), te.reduce_axis(kernel, "rw"), te.reduce_axis(cin, "rc")
        ho, wo = hp - kernel + 1, wp - kernel + 1
        self.Y = te.compute(
            (batch, ho, wo, cout),
            lambda n, h, w, co: te.sum(self.P[n, h + rh, w + rw, rc] * self.W[rh, rw, rc, co], axis=[rh, rw, rc]),
            name="conv",
        )
        rng = np.random.default_rng(seed)
        self.x = rng.uniform(-1, 1, (batch, height, width, cin)).astype("float32")
        self.w = rng.uniform(-1, 1, (kernel, kernel, cin, cout)).astype("float32")
        xp = np.pad(self.x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        ref = np.zeros((batch, ho, wo, cout), "float64")
        for a in range(kernel):
            for b in range(kernel):
                ref += np.einsum("nhwc,co->nhwo", xp[:, a:a + ho, b:b + wo, :], self.w[a, b])
        self.ref = ref.astype("float32")

    def state(self) -> State:
        return State([self.X, self.W, self.Y])

    def check(self, s: State, **kw) -> str:
        return run_and_check(s, [self.x, self.w], self.ref, **kw)


class RowSum:
    """S[i] = sum_k X[i, k]."""

    def __init__(self, m=6, k=30, seed=3):
        self.X = te.placeholder((m, k), name="X")
        kk = te.reduce_axis(k, "k")
        self.S = te.compute((m,), lambda i: te.sum(self.X[i, kk], axis=kk), name="S")
        self.x = np.random.default_rng(seed).uniform(-1, 1, (m, k)).astype("float32")
        self.ref = self.x.sum(axis=1)

    def state(self) -> State:
        return State([self.X, self.S])

    def check(self, s: State, **kw) -> str:
        return run_and_check(s, [self.x], self.ref, **kw)


class Norm:
    """NRM[0] = sqrt(sum_{i,k} X[i,k]^2): a 1-element output (Ansor's NRM)."""

    def __init__(self, m=10, k=20, seed=4):
        self.X = te.placeholder((m, k), name="X")
        ri, rk = te.reduce_axis(m, "ri"), te.reduce_axis(k, "rk")
        self.SQ = te.compute((1,), lambda z: te.sum(self.X[ri, rk] * self.X[ri, rk], axis=[ri, rk]), name="SQ")
        self.N = te.compute((1,), lambda z: te.sqrt(self.SQ[z]), name="NRM")
        self.x = np.random.default_rng(seed).uniform(-1, 1, (m, k)).astype("float32")
        self.ref = np.array([np.sqrt((self.x.astype("float64") ** 2).sum())], "float32")

    def state(self) -> State:
        return State([self.X, self.N])

    def check(self, s: State, **kw) -> str:
        return run_and_check(s, [self.x], self.ref, **kw)


class Softmax:
    """Row softmax as four stages: row max, exp, row sum, normalize."""

    def __init__(self, m=6, n=20, seed=5):
        self.X = te.placeholder((m, n), name="X")
        k1, k2 = te.reduce_axis(n, "k1"), te.reduce_axis(n, "k2")
        self.M = te.compute((m,), lambda i: te.max(self.X[i, k1], axis=k1), name="rowmax")
        self.E = te.compute((m, n), lambda i, j: te.exp(self.X[i, j] - self.M[i]), name="E")
        self.S = te.compute((m,), lambda i: te.sum(self.E[i, k2], axis=k2), name="rowsum")
        self.Y = te.compute((m, n), lambda i, j: self.E[i, j] / self.S[i], name="Y")
        self.x = np.random.default_rng(seed).uniform(-2, 2, (m, n)).astype("float32")
        e = np.exp(self.x - self.x.max(axis=1, keepdims=True))
        self.ref = e / e.sum(axis=1, keepdims=True)

    def state(self) -> State:
        return State([self.X, self.Y])

    def check(self, s: State, **kw) -> str:
        return run_and_check(s, [self.x], self.ref, **kw)


# ---------------------------------------------------------------------------------------------
# matmul (+relu)


def test_matmul_relu_naive():
    w = MatmulRelu()
    s = w.state()
    assert str(s) == "# no steps: the naive program"
    w.check(s)


def test_matmul_relu_divisible_tiling_reorder_parallel_vectorize_unroll():
    w = MatmulRelu()
    s = w.state()
    s.split("C", "i", [4, 2])
    s.split("C", "j", [4])
    s.split("C", "k", [4])
    s.reorder("C", ["i_0", "j_0", "k_0", "i_1", "k_1", "i_2", "j_1"])
    s.parallel("C", "i_0")
    s.unroll("C", "i_2")
    s.vectorize("C", "j_1")
    s.split("D", "j", [4])
    s.vectorize("D", "j_1")
    assert [i.extent for i in s.stage("C").iters] == [3, 3, 4, 4, 4, 2, 4]
    w.check(s)


def test_matmul_relu_non_divisible_splits():
    w = MatmulRelu()  # 24 x 12, k 16
    s = w.state()
    s.split("C", "i", [5])  # 24 = 5*5 - 1
    s.split("C", "j", [5], inner_to_outer=False)  # 5 outer parts of ceil(12/5)=3
    s.split("C", "k", [3, 2])  # 16 over 6
    s.split("D", "i", [7, 2])  # 24 over 14
    assert [i.extent for i in s.stage("C").iters] == [5, 5, 5, 3, 3, 3, 2]
    assert [i.extent for i in s.stage("D").iters] == [2, 7, 2, 12]
    w.check(s)


def test_split_inner_to_outer_false_divisible():
    w = MatmulRelu()
    s = w.state()
    s.split("D", "i", [2, 3], inner_to_outer=False)  # outer parts fixed: 2 x 3 x 4
    assert [i.extent for i in s.stage("D").iters] == [2, 3, 4, 12]
    s.compute_at("C", "D", "i_1")
    w.check(s)


def test_matmul_relu_fuse_parallel():
    w = MatmulRelu()
    s = w.state()
    s.split("D", "i", [6])
    s.split("D", "j", [4])
    s.reorder("D", ["i_0", "j_0", "i_1", "j_1"])
    s.fuse("D", ["i_0", "j_0"])
    assert s.stage("D").iters[0].name == "i_0_j_0_f"
    assert s.stage("D").iters[0].extent == 4 * 3
    s.parallel("D", "i_0_j_0_f")
    s.fuse("C", ["i", "j"])
    s.parallel("C", 0)
    w.check(s)


def test_fuse_three_and_vectorize_fused():
    w = MatmulRelu(m=4, n=6, k=8)
    s = w.state()
    s.split("D", "j", [3])
    s.fuse("D", ["i", "j_0", "j_1"])
    s.vectorize("D", "i_j_0_j_1_f")
    w.check(s)


def test_vectorize_extent_not_multiple_of_simd_width():
    w = MatmulRelu(m=8, n=12, k=8)
    s = w.state()
    s.vectorize("D", "j")  # 12: one 8-wide vector + remainder
    s.reorder("C", ["i", "k", "j"])
    s.vectorize("C", "j")
    w.check(s)
    w2 = MatmulRelu(m=5, n=13, k=3)
    s2 = w2.state()
    s2.vectorize("D", "j")
    s2.compute_at("C", "D", "i")
    s2.vectorize("C", "j")
    w2.check(s2)


def test_vectorize_rest_in_narrower_vectors():
    w = MatmulRelu(m=4, n=23, k=3)  # 23 lanes: 16 (one or two vectors), then 4, 2 and a scalar
    s = w.state()
    s.vectorize("D", "j")
    s.reorder("C", ["i", "k", "j"])
    s.vectorize("C", "j")
    source = w.check(s)
    assert "*(float4*)&" in source and "*(float2*)&" in source and "j = 22; j < 23" in source


def test_vectorize_reduce_innermost_and_unroll_reduce():
    w = Matmul()
    s = w.state()
    s.split("C", "k", [4])
    s.unroll("C", "k_1")
    w.check(s)
    s2 = w.state()
    s2.vectorize("C", "k")  # a reduce loop may be vectorized when innermost
    w.check(s2)


def test_pragma_auto_unroll_max_step():
    w = MatmulRelu()
    s = w.state()
    s.split("C", "i", [2])
    s.split("C", "k", [4])
    s.pragma("C", "i_0", "auto_unroll_max_step$64")
    s.pragma("D", "i", "auto_unroll_max_step$16")
    assert s.stage("C").auto_unroll_max_step == 64
    src = w.check(s)
    assert "unroll" in src


def test_storage_align_intermediate_root_and_attached():
    w = MatmulRelu()
    s = w.state()
    s.storage_align("C", "i", 8, 3)  # row stride 12 padded to 19
    assert s.stage("C").storage_align == ((0, 8, 3),)
    w.check(s)
    s2 = w.state()
    s2.cache_read("B", "shared", ["C"])
    s2.split("C", "i", [4])
    s2.compute_at("B_shared", "C", "i_0")
    s2.storage_align("B_shared", "ax0", 16, 1)
    w.check(s2)


def test_compute_at_producer_at_consumer_loops():
    w = MatmulRelu()
    for it in ["i_0", "j_0", "i_1", "j_1"]:
        s = w.state()
        s.split("D", "i", [4])
        s.split("D", "j", [5])  # non-divisible tile: bound inference must clip
        s.reorder("D", ["i_0", "j_0", "i_1", "j_1"])
        s.compute_at("C", "D", it)
        assert s.stage("C").location == "at" and s.stage("C").attach == ("D", it)
        w.check(s, check_roundtrip=(it == "j_0"))


def test_compute_root_after_compute_at():
    w = MatmulRelu()
    s = w.state()
    s.split("D", "i", [4])
    s.compute_at("C", "D", "i_0")
    s.compute_root("C")
    assert s.stage("C").location == "root" and s.stage("C").attach is None
    w.check(s)


def test_follow_split():
    w = MatmulRelu()
    s = w.state()
    s.split("D", "i", [4, 2])  # step 0
    s.follow_split("C", "i", 0, 2)  # C.i split exactly like D.i: lengths [4, 2]
    assert [i.extent for i in s.stage("C").iters[:3]] == [3, 4, 2]
    s.follow_split("C", "j", 0, 1)  # n_split 1: the lengths merged, [8] (non-divisible for 12)
    assert [i.extent for i in s.stage("C").iters[3:5]] == [2, 8]
    s.compute_at("C", "D", "i_1")
    w.check(s)


def test_follow_fused_split():
    w = MatmulRelu()
    s = w.state()
    s.split("D", "i", [3, 2])  # step 0: 4 x 3 x 2
    s.split("D", "j", [2, 3])  # step 1: 2 x 2 x 3
    s.reorder("D", ["i_0", "j_0", "i_1", "j_1", "i_2", "j_2"])
    s.fuse("D", ["i_0", "j_0"])
    s.cache_write("C", "local")
    s.follow_fused_split("C_local", "i", [0], 1, True)  # factor = 2 (inner)
    assert [i.extent for i in s.stage("C_local").iters[:2]] == [12, 2]
    s.follow_fused_split("C_local", "j", [0, 1], 0, False)  # nparts = 3 * 2 = 6 (outer)
    assert [i.extent for i in s.stage("C_local").iters[2:4]] == [6, 2]
    w.check(s)


def test_cache_write_ansor_style():
    w = MatmulRelu()
    s = w.state()
    s.cache_write("C", "local")
    assert [st.name for st in s.stages] == ["A", "B", "C_local", "C", "D"]
    s.split("D", "i", [4, 2])
    s.split("D", "j", [4])
    s.reorder("D", ["i_0", "j_0", "i_1", "i_2", "j_1"])
    s.compute_inline("C")
    s.compute_at("C_local", "D", "j_0")
    s.split("C_local", "i", [2])
    s.split("C_local", "k", [4])
    s.reorder("C_local", ["k_0", "i_0", "k_1", "i_1", "j"])
    s.unroll("C_local", "i_1")
    s.vectorize("C_local", "j")
    s.parallel("D", "i_0")
    w.check(s)


def test_cache_write_output_then_tile_copy_stage():
    w = Matmul()
    s = w.state()
    s.cache_write("C", "local")
    s.split("C", "i", [4])
    s.split("C", "j", [6])
    s.reorder("C", ["i_0", "j_0", "i_1", "j_1"])
    s.fuse("C", ["i_0", "j_0"])
    s.parallel("C", "i_0_j_0_f")
    s.compute_at("C_local", "C", "i_0_j_0_f")
    s.split("C_local", "k", [5])
    s.reorder("C_local", ["k_0", "k_1", "i", "j"])
    s.vectorize("C_local", "j")
    w.check(s)


def test_cache_read_compute_at():
    w = MatmulRelu()
    s = w.state()
    s.cache_read("B", "shared", ["C"])
    s.cache_read("A", "local", ["C"])
    assert "B_shared" in [st.name for st in s.stages] and "A_local" in [st.name for st in s.stages]
    w.check(s)
    s.split("C", "i", [4])
    s.split("C", "j", [3])
    s.reorder("C", ["i_0", "j_0", "k", "i_1", "j_1"])
    s.compute_at("B_shared", "C", "j_0")
    s.compute_at("A_local", "C", "k")
    s.compute_at("C", "D", "i")
    w.check(s)


def test_cache_read_and_cache_write_together_with_inline():
    w = MatmulRelu()
    s = w.state()
    s.cache_read("B", "shared", ["C"])
    s.fuse("D", ["i", "j"])
    s.parallel("D", "i_j_f")
    w.check(s)
    s.compute_at("B_shared", "C", "i")
    w.check(s)


def test_rfactor_divisible_factor_positions():
    w = Matmul()  # k = 20
    for pos in (0, 2):
        s = w.state()
        s.split("C", "k", [4])
        s.rfactor("C", "k_1", pos)
        names = [st.name for st in s.stages]
        assert "C_rf" in names
        rf = s.stage("C_rf")
        assert rf.tensor.shape[pos] == 4
        w.check(s)


def test_rfactor_non_divisible_split():
    w = Matmul(m=4, n=6, k=17)
    for it, pos in (("k_1", 0), ("k_0", 2), ("k_1", 2)):
        s = w.state()
        s.split("C", "k", [5])  # 17 over 4 x 5 = 20: the rf stage needs a guard
        s.rfactor("C", it, pos)
        w.check(s)


def test_rowsum_rfactor_parallel():
    w = RowSum()  # k = 30
    s = w.state()
    s.split("S", "k", [4])  # non-divisible: 8 x 4
    s.rfactor("S", "k_0", 0)
    assert [(i.name, i.kind) for i in s.stage("S_rf").iters] == [("k_0", "spatial"), ("i", "spatial"),
                                                                   ("k_1", "reduce")]
    s.parallel("S_rf", 0)
    s.vectorize("S_rf", "k_1")  # innermost reduce loop
    w.check(s)
    s2 = w.state()
    s2.split("S", "k", [6])
    s2.rfactor("S", "k_1", 1)
    s2.compute_at("S_rf", "S", "i")
    w.check(s2)


def test_norm_rfactor_and_inline_free():
    w = Norm()
    w.check(w.state())
    s = w.state()
    s.fuse("SQ", ["ri", "rk"])  # fuse two reduce loops
    s.split("SQ", "ri_rk_f", [8])  # 200 over 25 x 8
    s.rfactor("SQ", "ri_rk_f_0", 1)
    s.parallel("SQ_rf", "ri_rk_f_0")
    w.check(s)


def test_norm_rfactor_non_divisible_fused():
    w = Norm(m=7, k=9)
    s = w.state()
    s.fuse("SQ", ["ri", "rk"])  # 63
    s.split("SQ", "ri_rk_f", [8])  # 8 x 8 = 64 > 63
    s.rfactor("SQ", "ri_rk_f_1", 0)
    w.check(s)


# ---------------------------------------------------------------------------------------------
# conv2d NHWC with an explicit padding stage


def test_conv2d_naive():
    w = Conv2dNHWC()
    w.check(w.state())


def test_conv2d_inline_padding_tiled_vectorized():
    w = Conv2dNHWC()
    s = w.state()
    s.compute_inline("pad")
    s.split("conv", "w", [3])
    s.split("conv", "co", [4])
    s.reorder("conv", ["n", "h", "w_0", "co_0", "rh", "rw", "rc", "w_1", "co_1"])
    s.fuse("conv", ["n", "h"])
    s.parallel("conv", "n_h_f")
    s.unroll("conv", "w_1")
    s.vectorize("conv", "co_1")
    w.check(s)


def test_depthwise_inline_padding_is_one_vector_select_per_tap():
    """An inlined pad's condition does not depend on the channel lanes: the vectorized loop stays whole
    vectors, each tap loading a vector or zeros (it fell back to a scalar loop under `omp simd`: a
    14x14x576 depthwise conv ran 40 us instead of 23)."""
    h, w, c = 5, 6, 32
    X = te.placeholder((h, w, c), name="X")
    W = te.placeholder((3, 3, c), name="W")
    P = te.compute((h + 2, w + 2, c), lambda i, j, k: te.select(
        te.all_of(i >= 1, i < h + 1, j >= 1, j < w + 1), X[i - 1, j - 1, k], 0.0), name="pad")
    rh, rw = te.reduce_axis(3, "rh"), te.reduce_axis(3, "rw")
    Y = te.compute((h, w, c), lambda i, j, k: te.sum(P[i + rh, j + rw, k] * W[rh, rw, k], axis=[rh, rw]), name="dw")
    rng = np.random.default_rng(0)
    x, wt = rng.uniform(-1, 1, (h, w, c)).astype("float32"), rng.uniform(-1, 1, (3, 3, c)).astype("float32")
    xp = np.pad(x, ((1, 1), (1, 1), (0, 0)))
    ref = sum(xp[a:a + h, b:b + w] * wt[a, b] for a in range(3) for b in range(3))
    s = State([X, W, Y])
    s.compute_inline("pad")
    s.reorder("dw", ["i", "j", "rh", "rw", "k"])
    s.vectorize("dw", "k")
    source = run_and_check(s, [x, wt], ref)
    assert re.search(r"\? \*\(float\d+\*\)&", source) and "omp simd" not in source


@pytest.mark.parametrize("at", ["n", "h_0", "h_1", "w", "rh"])
def test_conv2d_padding_computed_at_conv_loop(at):
    w = Conv2dNHWC()
    s = w.state()
    s.split("conv", "h", [2])
    s.compute_at("pad", "conv", at)
    w.check(s, check_roundtrip=(at == "h_1"))


def test_conv2d_padding_at_non_divisible_tile():
    w = Conv2dNHWC(height=7, width=5, cin=3, cout=5)
    s = w.state()
    s.split("conv", "h", [3])
    s.split("conv", "w", [2])
    s.reorder("conv", ["n", "h_0", "w_0", "h_1", "w_1", "co", "rh", "rw", "rc"])
    s.compute_at("pad", "conv", "w_0")
    s.vectorize("pad", "c")
    w.check(s)


def test_conv2d_cache_write_multilevel_tiling():
    w = Conv2dNHWC()
    s = w.state()
    s.cache_write("conv", "local")
    s.compute_inline("pad")
    s.split("conv", "h", [3])
    s.split("conv", "co", [4])
    s.reorder("conv", ["n", "h_0", "w", "co_0", "h_1", "co_1"])
    s.fuse("conv", ["n", "h_0"])
    s.parallel("conv", "n_h_0_f")
    s.compute_at("conv_local", "conv", "co_0")
    s.split("conv_local", "rc", [2])
    s.reorder("conv_local", ["n", "rh", "rw", "rc_0", "h", "w", "rc_1", "co"])
    s.vectorize("conv_local", "co")
    w.check(s)


def test_conv2d_rfactor_and_padding_root_aligned():
    w = Conv2dNHWC(height=4, width=4, cin=4, cout=4)
    s = w.state()
    s.storage_align("pad", "w", 8, 2)
    s.split("conv", "rc", [2])
    s.rfactor("conv", "rc_1", 4)
    w.check(s)


# ---------------------------------------------------------------------------------------------
# softmax-like multi-stage graph


def test_softmax_naive():
    w = Softmax()
    w.check(w.state())


def test_softmax_inline_and_compute_at():
    w = Softmax()
    s = w.state()
    s.compute_inline("E")  # E is read by rowsum and Y; inlining recomputes exp in both
    s.compute_at("rowsum", "Y", "i")
    s.parallel("Y", "i")
    s.vectorize("Y", "j")
    s.split("rowmax", "k1", [8])
    w.check(s)


def test_softmax_cache_and_root_stages():
    w = Softmax()
    s = w.state()
    s.split("Y", "j", [5])
    s.vectorize("Y", "j_1")
    s.split("E", "j", [8])
    s.vectorize("E", "j_1")
    s.parallel("E", "i")
    s.storage_align("E", "i", 16, 4)
    s.split("rowsum", "k2", [4])
    s.rfactor("rowsum", "k2_1", 1)
    s.compute_at("rowsum_rf", "rowsum", "i")
    w.check(s)


# ---------------------------------------------------------------------------------------------
# state-level properties


def test_print_and_json_roundtrip_everything():
    w = MatmulRelu()
    s = w.state()
    s.cache_write("C", "local")
    s.cache_read("A", "shared", ["C_local"])
    s.split("D", "i", [3, 2])
    s.split("D", "j", [4], inner_to_outer=False)
    s.reorder("D", ["i_0", "j_0", "i_1", "j_1", "i_2"])
    s.fuse("D", ["i_0", "j_0"])
    s.compute_inline("C")
    s.compute_at("C_local", "D", "i_0_j_0_f")
    s.follow_split("C_local", "i", 2, 2)
    s.follow_fused_split("C_local", "j", [2, 3], 0, False)
    s.split("C_local", "k", [4])
    s.pragma("C_local", "i_0", "auto_unroll_max_step$16")
    s.compute_at("A_shared", "C_local", "k_0")
    s.storage_align("A_shared", "ax0", 8, 1)
    s.parallel("D", "i_0_j_0_f")
    s.unroll("D", "i_2")
    s.annotate("D", "j_1", "none")
    text = str(s)
    for call in ("cache_write", "cache_read", "split", "reorder", "fuse", "compute_inline", "compute_at",
                 "follow_split", "follow_fused_split", "pragma", "storage_align", "parallel", "unroll",
                 "inner_to_outer=False"):
        assert f"{call}" in text
    assert text.splitlines()[0] == "s.cache_write('C', 'local')"
    w.check(s)


def test_json_roundtrip_on_separately_built_dag_gives_same_source():
    w1, w2 = MatmulRelu(), MatmulRelu()
    s = w1.state()
    s.split("C", "k", [4])
    s.rfactor("C", "k_1", 1)
    s.compute_root("C_rf")
    s2 = State.from_json(ComputeDAG([w2.A, w2.B, w2.D]), s.to_json())
    assert s2 == s
    assert build(s2).source == build(s).source


def test_stage_and_iterator_by_index_and_tensor():
    w = MatmulRelu()
    s1 = w.state()
    s1.split("C", "i", [4])
    s1.parallel("D", "i")
    s2 = w.state()
    s2.split(w.C, 0, [4])
    s2.parallel(3, 0)
    assert s1 == s2 and str(s1) == str(s2)


def test_copy_is_independent():
    w = MatmulRelu()
    s = w.state()
    s.split("C", "i", [4])
    c = s.copy()
    c.split("C", "j", [4])
    assert len(s.steps) == 1 and len(c.steps) == 2
    assert s != c


def test_failed_step_keeps_state_usable():
    w = MatmulRelu()
    s = w.state()
    s.split("C", "i", [4])
    with pytest.raises(ScheduleError):
        s.split("C", "i", [4])  # `i` no longer exists
    s.split("C", "i_1", [2])
    w.check(s)


def test_to_loops_mentions_iterators():
    w = MatmulRelu()
    s = w.state()
    s.split("C", "i", [4])
    s.fuse("D", ["i", "j"])
    text = s.to_loops()
    for name in ("i_0", "i_1", "k", "i_j_f"):
        assert name in text


def _builds_or_rejects(s: State, step, check) -> None:
    """`step` must either raise ScheduleError (state unchanged) or leave a state that builds correctly."""
    before = (s.steps, s.stages)
    try:
        step(s)
    except ScheduleError:
        assert (s.steps, s.stages) == before
        return
    check(s)


def test_cache_write_of_a_consumer_with_an_attached_producer():
    w = MatmulRelu()
    s = w.state()
    s.compute_at("C", "D", "i")
    _builds_or_rejects(s, lambda st: st.cache_write("D", "local"), w.check)


def test_cache_write_after_cache_read_attached_at_spatial_loop():
    w = MatmulRelu()
    s = w.state()
    s.cache_read("B", "shared", ["C"])
    s.compute_at("B_shared", "C", "j")
    _builds_or_rejects(s, lambda st: st.cache_write("C", "local"), w.check)


def test_cache_write_before_compute_at_is_the_working_order():
    w = MatmulRelu()
    s = w.state()
    s.cache_read("B", "shared", ["C"])
    s.cache_write("C", "local")
    s.compute_at("B_shared", "C_local", "j")
    s.compute_at("C_local", "C", "i")
    w.check(s)


def test_parallel_loop_inside_vectorized_loop():
    w = Matmul()
    s = w.state()
    s.vectorize("C", "i")  # an outer spatial loop may be vectorized
    _builds_or_rejects(s, lambda st: st.parallel("C", "j"), w.check)


def test_parallel_producer_attached_inside_vectorized_loop():
    w = MatmulRelu()
    s = w.state()
    s.vectorize("D", "i")
    s.compute_at("C", "D", "i")
    _builds_or_rejects(s, lambda st: st.parallel("C", "j"), w.check)


def test_reorder_keeps_vectorized_reduce_loop_innermost():
    w = RowSum()
    s = w.state()
    s.vectorize("S", "k")
    s.parallel("S", "i")
    _builds_or_rejects(s, lambda st: st.reorder("S", ["k", "i"]), w.check)


def test_rfactor_after_spatial_split():
    w = Matmul()
    s = w.state()
    s.split("C", "k", [4])
    s.split("C", "i", [4])
    _builds_or_rejects(s, lambda st: st.rfactor("C", "k_1", 0), w.check)


def test_a_split_inside_a_non_divisible_split_adds_no_term_twice():
    """s (6) split by 3 into s_0 (2) x s_1 (3), then s_1 split inner-to-outer by [1, 2] into 2 x 1 x 2 loops that reach
    s_1 = 3: the root value s_0 * 3 + s_1 stays below 6 there, so only a guard on s_1 itself keeps X[3] from being added
    twice (graph fuzzer, schedule seed 640); a spatial axis split the same way, its duplicated rows after their init."""
    x = te.placeholder((6, 6), name="X")
    s_ax = te.reduce_axis(6, "s")
    total = te.compute((6,), lambda i: te.sum(x[i, s_ax], axis=s_ax), name="T")
    for axis, order in (("s", None), ("i", ["i_0", "s", "i_1_0", "i_1_1", "i_1_2"])):
        st = State([x, total])
        st.split("T", axis, [3])
        st.split("T", f"{axis}_1", [1, 2], inner_to_outer=True)
        if order:
            st.reorder("T", order)
        a = np.random.default_rng(3).uniform(-1, 1, (6, 6)).astype("float32")
        run_and_check(st, [a], a.sum(1))
