"""Run-time packing (schedule/packing.py): an input copied into its reader's tile layout, by a stage
of the program, computes the same, follows the tile sizes, and is offered only where it can help."""

from __future__ import annotations

import numpy as np
import pytest
from search_tasks import c2d_relu, cached_gmm, gmm, make_task

from tensorgen import te
from tensorgen.build import build
from tensorgen.schedule.packing import PackLayoutStep
from tensorgen.schedule.state import State
from tensorgen.search.annotate import (
    AnnotationPolicy,
    fill_tile_sizes,
    location_candidates,
    sample_initial_population,
)
from tensorgen.search.crossover import crossover, match_sketch, step_owners
from tensorgen.search.sketch import generate_sketches
from tensorgen.te import ops

M, N, K = 64, 96, 80


def tiled_gmm() -> State:
    s = cached_gmm(M, N, K)
    s.split("C_local", "i", [4, 2])
    s.split("C_local", "j", [3, 16])
    s.split("C_local", "k", [8])
    s.reorder("C_local", ["i_0", "j_0", "k_0", "i_1", "j_1", "k_1", "i_2", "j_2"])
    return s


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(0)
    return rng.uniform(-1, 1, (M, K)).astype("float32"), rng.uniform(-1, 1, (K, N)).astype("float32")


@pytest.mark.parametrize("where", ["root", "k_0", "j_0"])
def test_packed_operand_is_in_tile_order_and_computes_the_same(operands, where):
    a, b = operands
    s = tiled_gmm().pack_layout("B", "C_local")
    packed = s.stage("B_packed")
    # B (k, j) in the order C_local walks it: j_0, k_0, j_1, k_1, j_2
    assert packed.tensor.shape == (2, 10, 3, 8, 16)
    assert [it.name for it in packed.iters] == ["j_0", "k_0", "j_1", "k_1", "j_2"]
    if where != "root":
        s.compute_at("B_packed", "C_local", where)
    s.parallel("C_local", "i_0")
    s.vectorize("B_packed", "j_2")
    (c,) = build(s).run(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    replayed = State.from_json(s.dag, s.to_json())
    assert replayed == s and "s.pack_layout('B', 'C_local')" in str(s)


def test_sketch_copies_in_own_layout_until_tile_sizes_are_filled():
    """The layout follows the split lengths at replay: unfilled in a sketch, mutated in evolution."""
    task = gmm()
    sketches = [s for s in generate_sketches(task) if PackLayoutStep in [type(t) for t in s.steps]]
    assert sketches
    policy, rng = AnnotationPolicy(), np.random.default_rng(0)
    for sketch in sketches:
        assert sketch.stage("B_packed").tensor.shape == sketch.stage("B").tensor.shape
        filled = fill_tile_sizes(sketch, rng, policy)
        reader = filled.stage(filled.consumers("B_packed")[0])
        loops = {it.name: it.extent for it in reader.iters}
        assert list(filled.stage("B_packed").tensor.shape) == [
            loops[it.name] for it in filled.stage("B_packed").iters]
        # one dimension per tile level of b, k, j (4 + 2 + 4), extent 1 included: a mutation that
        # moves a level to or from 1 keeps the loops that later steps name
        assert len(filled.stage("B_packed").iters) == 10


def test_sampled_packed_programs_compute_the_same():
    task = gmm(32)
    sketches = [s for s in generate_sketches(task) if PackLayoutStep in [type(t) for t in s.steps]]
    pop = sample_initial_population(task, sketches, 12, np.random.default_rng(1))
    assert "root" in {s.stage("B_packed").location for s in pop} <= {"root", "inline"}
    rng = np.random.default_rng(2)
    a = rng.uniform(-1, 1, (1, 32, 32)).astype("float32")
    b = rng.uniform(-1, 1, (1, 32, 32)).astype("float32")
    for s in pop:
        (c,) = build(s).run(a, b)
        np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_a_copy_is_not_computed_where_it_would_be_copied_again():
    """B_packed under GMM's tile loops sits inside an i loop that reads the same panel each iteration:
    no location but the root (or inline); a copy read whole by each iteration of its consumer's outer
    loop may still go there."""
    task = gmm(32)
    sketch = next(s for s in generate_sketches(task) if PackLayoutStep in [type(t) for t in s.steps])
    state = fill_tile_sizes(sketch, np.random.default_rng(0), AnnotationPolicy())
    assert location_candidates(state, state.stage_id("B_packed")) == []
    a = te.placeholder((64, 32), name="A")
    copy = te.compute((64, 32), lambda i, j: a[i, j], name="copy")
    out = te.compute((64, 32), lambda i, j: copy[i, j] * 2.0, name="out")
    state = State(make_task([a], [out]).dag)
    state.split("out", "i", [8])
    assert location_candidates(state, state.stage_id("copy")) == ["i_0", "i_1", "j"]


def is_packed(state: State) -> bool:
    return any(st.name == "B_packed" for st in state.stages)


def packed_inputs(task) -> set[str]:
    return {s.stages[t.stage_id].name for s in generate_sketches(task) for t in s.steps
            if isinstance(t, PackLayoutStep)}


def test_only_a_large_streamed_operand_that_is_not_constant_is_packed():
    """GMM packs B (its vectorized loop loads B's rows) but not A (broadcast); a constant B gets its
    layout at build time instead; a conv packs its weight (HWIO: read along the output channels, the
    vectorized loop) when it is larger than L2 / 4, but never its input, which it reads at computed indices."""
    assert packed_inputs(gmm()) == {"B"}
    a = te.placeholder((1, 64, 64), name="A")
    w = te.placeholder((1, 64, 64), name="B", constant=True)
    assert packed_inputs(make_task([a, w], [ops.batch_matmul(a, w)], l2_bytes=1024)) == set()
    ins, outs = ops.make_c2d(8, 8, 16, 16, 3, 1, 1)  # weight: 9 KB
    assert packed_inputs(make_task(ins, outs, l2_bytes=8 * 1024)) == {ins[1].name}
    assert packed_inputs(make_task(ins, outs, l2_bytes=64 * 1024)) == set()
    assert packed_inputs(c2d_relu()) == set()


def test_packed_programs_match_their_own_sketch_for_crossover():
    """A packed sketch extends an unpacked one; its programs must match the longer sketch, or crossover
    would mix programs with different stages."""
    task = gmm(32)
    sketches = generate_sketches(task)
    pop = sample_initial_population(task, sketches, 24, np.random.default_rng(4))
    for state in pop:
        sketch = sketches[match_sketch(state, sketches)]
        assert is_packed(sketch) == is_packed(state)
    packed = [s for s in pop if is_packed(s)]
    k = match_sketch(packed[0], sketches)
    twins = [s for s in packed if match_sketch(s, sketches) == k and s.steps != packed[0].steps]
    rng = np.random.default_rng(5)
    kids = [crossover(task, packed[0], t, len(sketches[k].steps), step_owners(sketches[k]), rng) for t in twins]
    assert any(kid is not None for kid in kids)
