"""Property: random fused element-wise DAGs under random schedules compile and compute what NumPy does.

Each stage combines two reads drawn from the earlier stages, the input (read twice at the same or at
different index orders) and a broadcast bias; stages are inlined, computed at a loop of the output or
at the root, tiled, unrolled, vectorized and parallelized at random, one seeded program per case. The
micro-kernel base pointers (codegen/rebase.py) of sibling loops that read one buffer once had one name
("redefinition of 'input0_at'", ConvNeXt's LayerNorm/permute/add chains).
Set TENSORGEN_PROPERTY_EXAMPLES to explore more.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from te_eval import evaluate

from tensorgen import te
from tensorgen.build import build
from tensorgen.schedule import State

EXAMPLES = int(os.environ.get("TENSORGEN_PROPERTY_EXAMPLES", "40"))
SHAPE = (8, 8)
OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
       "max": te.max_expr, "min": te.min_expr}
ORDERS = [(0, 1), (1, 0)]  # the axes are equal, so a permuted read stays in bounds


def random_dag(rng: np.random.Generator) -> tuple[list[te.Tensor], te.Tensor]:
    x = te.placeholder(SHAPE, name="input0")
    bias = te.placeholder((SHAPE[-1],), name="bias")
    stages: list[te.Tensor] = []
    for k in range(rng.integers(1, 5)):
        sources = [x, x, bias, *stages]
        reads = [(sources[rng.integers(len(sources))], ORDERS[rng.integers(2)]) for _ in range(2)]
        if stages and all(src is not stages[-1] for src, _ in reads):
            reads[0] = (stages[-1], reads[0][1])  # a chain: every stage is read, the last is the output
        op = OPS[sorted(OPS)[rng.integers(len(OPS))]]

        def body(*idx, reads=reads, op=op):
            def load(t, order):
                return t[idx[-1]] if t.ndim == 1 else t[tuple(idx[d] for d in order)]
            return op(load(*reads[0]), load(*reads[1]))

        stages.append(te.compute(SHAPE, body, name=f"s{k}"))
    return [x, bias], stages[-1]


def random_tile(rng: np.random.Generator, s: State, name: str) -> None:
    """The innermost axis split, its inner part unrolled, vectorized or left: the loop around such a
    part is a micro-kernel whose input base pointers are hoisted."""
    factor = int(rng.choice([1, 2, 4, 8]))
    if factor > 1:
        s.split(name, "i1", [factor])
        how = rng.choice(["none", "unroll", "unroll", "vectorize", "vectorize"])
        if how != "none":
            getattr(s, how)(name, "i1_1")


def random_schedule(rng: np.random.Generator, s: State, out: str) -> None:
    random_tile(rng, s, out)
    for name in reversed([stage.name for stage in s.stages if not stage.is_placeholder][:-1]):
        where = rng.choice(["inline", "root", "at"])
        if where == "inline":
            s.compute_inline(name)
            continue
        if where == "at" and s.consumers(name) == [out]:
            its = [i.name for i in s.stage(out).iters if i.annotation == "none"]
            s.compute_at(name, out, its[0] if rng.integers(2) else its[rng.integers(len(its))])  # 0: siblings
        random_tile(rng, s, name)
        if s.stage(name).location == "root" and rng.integers(2):
            s.parallel(name, "i0")
    if rng.integers(2):
        s.parallel(out, "i0")


@pytest.mark.parametrize("seed", range(EXAMPLES))
def test_random_fused_elementwise_schedules_compile_and_match_numpy(seed):
    rng = np.random.default_rng(seed)
    args, out = random_dag(rng)
    s = State([*args, out])
    random_schedule(rng, s, out.name)
    feed = {t: rng.uniform(-1, 1, t.shape).astype("float32") for t in args}
    (ref,) = evaluate([out], feed)
    f = build(s)
    (got,) = f.run(*[feed[t] for t in s.dag.inputs])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=f"{s}\n{f.source}")


def test_sibling_micro_kernels_reading_one_buffer_get_distinct_base_pointers():
    """The smallest reproducer: a = x + 1 computed at b's row loop, both rows tiled and unrolled, each
    tile loop hoisting &x[i * 16]."""
    x = te.placeholder((8, 16), name="x")
    a = te.compute((8, 16), lambda i, j: x[i, j] + 1.0, name="a")
    b = te.compute((8, 16), lambda i, j: a[i, j] * x[i, j], name="b")
    s = State([x, b])
    s.compute_at("a", "b", "i")
    for name in ("a", "b"):
        s.split(name, "j", [4])
        s.unroll(name, "j_1")
    f = build(s)
    assert "x_at_1" in f.source
    xv = np.random.default_rng(0).uniform(-1, 1, (8, 16)).astype("float32")
    np.testing.assert_array_equal(f.run(xv)[0], (xv + 1) * xv)
