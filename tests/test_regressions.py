"""Programs that once compiled to wrong code, kept so they stay right."""

import numpy as np

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
