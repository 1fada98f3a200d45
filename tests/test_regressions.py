"""Programs that once compiled to wrong code, kept so they stay right."""

import numpy as np
import pytest

from tensorgen import State, build, te


def _conv():
    x = te.placeholder((1, 5, 6, 3), name="X")
    wt = te.placeholder((3, 3, 3, 4), name="W")
    pad = te.compute(
        (1, 7, 8, 3),
        lambda n, h, w, c: te.select(te.all_of(h >= 1, h < 6, w >= 1, w < 7), x[n, h - 1, w - 1, c], 0.0),
        name="pad",
    )
    rh, rw, rc = te.reduce_axis(3, "rh"), te.reduce_axis(3, "rw"), te.reduce_axis(3, "rc")
    y = te.compute((1, 5, 6, 4), lambda n, h, w, co: te.sum(pad[n, h + rh, w + rw, rc] * wt[rh, rw, rc, co],
                                                             axis=[rh, rw, rc]), name="conv")
    return x, wt, y


def test_unrolled_loop_around_local_arrays_gcc12_ivopts():
    """gcc 12 -O3 miscompiled `#pragma GCC unroll` on a loop holding local arrays (found by hypothesis)."""
    x, w, y = _conv()
    s = State([x, w, y])
    s.cache_write("conv", "local")
    s.split("conv", "h", [5])
    s.split("conv", "w", [2], inner_to_outer=False)
    s.split("conv", "co", [2], inner_to_outer=False)
    s.reorder("conv", ["n", "h_1", "h_0", "w_0", "w_1", "co_0", "co_1"])
    s.fuse("conv", ["n", "h_1"])
    s.split("conv_local", "h", [2], inner_to_outer=False)
    s.split("conv_local", "w", [1, 1])
    s.split("conv_local", "co", [2], inner_to_outer=False)
    s.split("conv_local", "rc", [3], inner_to_outer=False)
    s.split("conv_local", "rw", [3], inner_to_outer=False)
    s.reorder("conv_local", ["w_0", "rw_0", "h_1", "n", "w_1", "w_2", "co_0", "co_1", "rh", "h_0", "rw_1",
                             "rc_0", "rc_1"])
    s.compute_at("pad", "conv_local", "rw_0")
    s.compute_at("conv_local", "conv", "n_h_1_f")
    s.unroll("conv", "n_h_1_f")
    rng = np.random.default_rng(0)
    xs, ws = rng.uniform(-1, 1, (1, 5, 6, 3)).astype("float32"), rng.uniform(-1, 1, (3, 3, 3, 4)).astype("float32")
    (got,) = build(s).run(xs, ws)
    (want,) = build(State([x, w, y])).run(xs, ws)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 7), (5, 3, 3), (4, 2, 2, 3)])
def test_a_select_on_data_with_loads_in_its_arms_is_exact(shape):
    """gcc 12 -O3 -march=native on AVX-512 unrolled a small PRelu nest and masked the slope's loads with the first
    vector's mask (-0 for a fifth of the negative inputs); such selects now go through a function (eager arms)."""
    x, s = te.placeholder(shape, name="x"), te.placeholder(shape, name="s")
    y = te.compute(shape, lambda *i: te.select(x[i] < 0, x[i] * s[i], x[i]), name="y")
    z = te.compute(shape, lambda *i: te.select(s[i] < 0, x[i], 0.0), name="z")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    for out, want in ((y, np.where(a < 0, a * b, a)), (z, np.where(b < 0, a, 0))):
        np.testing.assert_array_equal(build([x, s, out]).run(a, b)[0], want)


def test_a_model_rebuilt_into_the_same_folder_runs_next_to_the_old_one(tmp_path):
    """Two models built into one folder in one process (a notebook rebuilding): dlopen handed the second the first's
    library (running its kernels with the second's manifest crashed), and the build overwrote the file the first had
    mapped. Both run correctly now, the first after the second was built."""
    from onnx import TensorProto, helper

    from tensorgen.graph.backend.build import build_model
    from tensorgen.runtime.model import CompiledModel

    def model(op: str, shape: list[int]):
        graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], op,
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    first = CompiledModel(build_model(model("Relu", [2, 3]), tmp_path / "m"), threads=1)
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(first.run([x])[0], np.maximum(x, 0))
    second = CompiledModel(build_model(model("Neg", [4, 5]), tmp_path / "m"), threads=1)
    y = np.arange(20, dtype=np.float32).reshape(4, 5)
    np.testing.assert_array_equal(second.run([y])[0], -y)
    np.testing.assert_array_equal(first.run([x])[0], np.maximum(x, 0))


@pytest.mark.parametrize("target", ["cpu", "cuda -emulate=1"])
def test_integer_division_by_zero_is_zero_not_a_trap(target):
    """ONNX leaves integer Mod (and Div) by 0 undefined; generated code gives 0 (a SIGFPE ended the program, and every
    candidate of a task with an int64 divisor crashed in the harness, which fills integer inputs with 0)."""
    a = te.placeholder((6,), "int64", name="a")
    b = te.placeholder((6,), "int64", name="b")
    f = te.compute((6,), lambda i: a[i] // b[i], name="f")
    m = te.compute((6,), lambda i: a[i] % b[i], name="m")
    fn = build([a, b, f, m], target=target)
    x = np.array([7, -7, 7, -7, 5, 9], np.int64)
    y = np.array([2, 2, -2, 0, 0, 3], np.int64)
    got_f, got_m = fn.run(x, y)
    nonzero = y != 0
    np.testing.assert_array_equal(got_f[nonzero], x[nonzero] // y[nonzero])
    np.testing.assert_array_equal(got_m[nonzero], x[nonzero] % y[nonzero])
    assert not got_f[~nonzero].any() and not got_m[~nonzero].any()
