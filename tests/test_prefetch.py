"""Software prefetch of the next parallel iteration's weight panel (codegen/prefetch.py)."""

from __future__ import annotations

import numpy as np

from tensorgen import te
from tensorgen.build import build
from tensorgen.codegen.c import render_c
from tensorgen.schedule import State
from tensorgen.schedule.lower import lower


def dense(constant: bool, panels: int = 16, depth: int = 256) -> State:
    """y = x @ W with W stored panel by panel, (panels, depth, 32): the layout a packed weight has."""
    x = te.placeholder((8, depth), name="x")
    w = te.placeholder((panels, depth, 32), name="w", constant=constant)
    k = te.reduce_axis(depth, "k")
    y = te.compute((8, panels * 32), lambda i, j: te.sum(x[i, k] * w[j // 32, k, j % 32], axis=k), name="y")
    s = State([x, w, y])
    s.split("y", "j", [32])
    s.reorder("y", ["j_0", "i", "k", "j_1"])
    s.parallel("y", "j_0")
    s.vectorize("y", "j_1")
    return s


def test_a_constant_read_panel_by_panel_prefetches_the_next_panel_and_computes_the_same():
    state = dense(constant=True)
    source = render_c(lower(state))
    assert "prefetch_lines(&w[(j_0 + 1) * 8192]" in source and "if (j_0 < 15" in source
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 256)).astype("float32")
    w = rng.standard_normal((16, 256, 32)).astype("float32")
    (y,) = build(state).run(x, w)
    np.testing.assert_allclose(y, x @ w.transpose(1, 0, 2).reshape(256, 512), rtol=1e-4, atol=1e-4)


def test_no_prefetch_for_inputs_small_panels_or_a_serial_loop():
    assert "prefetch_lines" not in render_c(lower(dense(constant=False)))  # an input is not waiting in memory
    assert "prefetch_lines" not in render_c(lower(dense(constant=True, depth=16)))  # 2 KB panels stay cached
    serial = dense(constant=True)
    serial.annotate("y", "j_0", "none")
    assert "prefetch_lines" not in render_c(lower(serial))
