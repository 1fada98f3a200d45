"""Pruner's static analyzer on a CPU (costmodel/psa.py) and the search's use of it as a prefilter.

The analyzer must order programs the way a CPU does where the reason is structural: a serial program
behind a parallel one, one dependency chain behind a register tile, half-filled vectors behind full
ones, a register tile that spills behind one that fits. The prefilter must keep PSA's best samples
and a random share of the rest.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from search_tasks import cached_gmm, gmm

from tensorgen import te
from tensorgen.costmodel import RandomModel
from tensorgen.costmodel.psa import StaticAnalyzer
from tensorgen.schedule.state import State
from tensorgen.search.children import LazyState
from tensorgen.search.sketch import generate_sketches
from tensorgen.search.sketch_policy import SketchPolicy
from tensorgen.target import HardwareParams

HW = HardwareParams(cores=2, simd_bytes=64, l2_bytes=1 << 20, peak_gflops=300.0)
N = 256


def gmm_program(i_inner: int = 4, j_inner: int = 64, *, parallel: int = 8, k_innermost: bool = False) -> State:
    """C = A @ B with a register tile i_inner x j_inner inside the reduction loop k_1 (or k_1 innermost)."""
    s = cached_gmm(N, N, N)
    s.split("C_local", "i", [parallel, N // parallel // i_inner, i_inner][1:])
    s.split("C_local", "j", [1, j_inner])
    s.split("C_local", "k", [16])
    inner = ["i_2", "j_2", "k_1"] if k_innermost else ["k_1", "i_2", "j_2"]
    s.reorder("C_local", ["i_0", "j_0", "k_0", "i_1", "j_1", *inner])
    if parallel > 1:
        s.parallel("C_local", "i_0")
    if not k_innermost:
        s.vectorize("C_local", "j_2")
    return s


def latency(state: State) -> float:
    return StaticAnalyzer(HW).latency(state)


def test_register_tile_in_parallel_is_the_fastest_estimate():
    good = latency(gmm_program())
    assert 0 < good < math.inf
    worse = {
        "serial": gmm_program(parallel=1),
        "one accumulator chain": gmm_program(k_innermost=True),
        "half-filled vectors": gmm_program(i_inner=8, j_inner=8),
        "spilling tile": gmm_program(i_inner=16, j_inner=64),
    }
    for what, state in worse.items():
        assert latency(state) > good, what


def test_a_tile_spills_by_what_it_holds_not_by_what_it_loads():
    """16 x 16: 16 accumulators, B's row (1 vector) held across the rows, A's 16 points streamed one at a time: 18
    registers of 32 fit, though the tile loads 17 vectors per step (the count that charged the 7 x 16 tiles of
    MobileNet-V2's 1x1 convs, the fastest measured there, for spilling); 16 x 64 (64 accumulators) spills."""
    roomy = StaticAnalyzer(HW, registers=256)
    fits, spills = gmm_program(i_inner=16, j_inner=16), gmm_program(i_inner=16, j_inner=64)
    assert StaticAnalyzer(HW).latency(fits) == pytest.approx(roomy.latency(fits))
    assert StaticAnalyzer(HW).latency(spills) > 1.5 * roomy.latency(spills)


def test_a_short_reduction_inside_spatial_loops_holds_what_they_do_not_move():
    """16 rows x (4 steps of k x 1 vector), k_1 innermost but for the vector loop: one accumulator per row, yet gcc
    unrolls the 4 steps and keeps B's 4 vectors in registers while the rows pass (ResNet-50's fastest 3x3 convs are
    such weight-stationary tiles); charged as a 1-accumulator tile (alpha = 1 + 2 loads) it cost 1.45x the 16 x 1
    register tile of the same loops with k_1 outside; now 1 + (4 points of A + the accumulator) / 4 steps. If B's
    vectors cannot stay in registers beside the accumulator, they are loaded again."""
    def program(k_inside: bool) -> State:
        s = cached_gmm(N, N, N)
        s.split("C_local", "i", [2, 16])
        s.split("C_local", "j", [1, 16])
        s.split("C_local", "k", [4])
        inner = ["i_2", "k_1"] if k_inside else ["k_1", "i_2"]
        s.reorder("C_local", ["i_0", "j_0", "i_1", "j_1", "k_0", *inner, "j_2"])
        s.parallel("C_local", "i_0")
        s.vectorize("C_local", "j_2")
        return s

    stationary, tile = latency(program(True)), latency(program(False))
    assert stationary < 1.15 * tile
    assert StaticAnalyzer(HW, registers=2).latency(program(True)) > 1.3 * tile


def test_data_every_parallel_iteration_reuses_is_fetched_once():
    """A (1 MiB) and C stream through a 64 KiB L2 eight rows per parallel iteration; B (4 KiB) is read whole by each
    of the 512 iterations but stays in cache: the memory-bound estimate is about A + B + C (and the copy out of
    C_local) once, not 512 B's."""
    hw = HardwareParams(cores=2, simd_bytes=64, l2_bytes=64 << 10, peak_gflops=1e9)  # compute is free
    s = cached_gmm(4096, 16, 64)
    s.split("C_local", "i", [8])
    s.parallel("C_local", "i_0")
    a, b, c = 4096 * 64 * 4, 64 * 16 * 4, 4096 * 16 * 4
    once = (a + b + c + 2 * c) / (20e9 * hw.cores)  # the copy reads C_local and writes C
    assert once <= StaticAnalyzer(hw).latency(s) < 1.2 * once


def test_rows_a_sliding_window_shares_are_fetched_once():
    """A 3 x 3 box filter over a 1 MiB image, one output row per parallel iteration: each iteration reads three
    input rows, two of which the previous iteration on its core read, so the memory-bound estimate is about the
    image once and the output twice (zeroed by one statement, accumulated by the next), not three images."""
    hw = HardwareParams(cores=2, simd_bytes=64, l2_bytes=64 << 10, peak_gflops=1e9)  # compute is free
    n = 510
    image = te.placeholder((n + 2, n + 2), name="image")
    rh, rw = te.reduce_axis(3, "rh"), te.reduce_axis(3, "rw")
    box = te.compute((n, n), lambda h, w: te.sum(image[h + rh, w + rw], axis=[rh, rw]), name="box")
    s = State([image, box])
    s.parallel("box", "h")
    once = ((n + 2) ** 2 + 2 * n * n) * 4 / (20e9 * hw.cores)
    assert once <= StaticAnalyzer(hw).latency(s) < 1.2 * once


def test_data_a_loop_cycles_through_is_fetched_again_when_it_does_not_fit():
    """C = A @ B, eight row blocks of A after one another, each running over B's 64 column blocks: a block of B
    fits the 64 KiB L2 but B (1 MiB) does not, so every row block fetches B again although B does not move with it:
    the memory-bound estimate is about eight B's (and A, and C zeroed and accumulated), not one."""
    hw = HardwareParams(cores=2, simd_bytes=64, l2_bytes=64 << 10, peak_gflops=1e9)  # compute is free
    m, n, k = 64, 4096, 64
    a, b = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    r = te.reduce_axis(k, "k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    s = State([a, b, c])
    s.split("C", "i", [8])
    s.split("C", "j", [64])
    s.reorder("C", ["i_0", "j_0", "i_1", "k", "j_1"])
    s.vectorize("C", "j_1")
    once = (m * k + 8 * k * n + 2 * m * n) * 4 / (20e9 * hw.cores)
    assert once <= StaticAnalyzer(hw).latency(s) < 1.2 * once


def test_the_next_tiles_overlap_a_short_chain():
    """A tile of 4 accumulators over a 9-step reduction: the out-of-order core overlaps the next tiles' chains with
    it, so the tile is not charged for too few chains; over 512 steps it is (the window holds no other tile)."""
    hw = HardwareParams(cores=2, simd_bytes=64, l2_bytes=1 << 20, peak_gflops=1.0)  # compute-bound

    def program(k: int) -> State:
        s = cached_gmm(64, 64, k)
        s.split("C_local", "i", [4])
        s.split("C_local", "j", [16])
        s.reorder("C_local", ["i_0", "j_0", "k", "i_1", "j_1"])
        s.vectorize("C_local", "j_1")
        return s

    psa, no_overlap = StaticAnalyzer(hw), StaticAnalyzer(hw, window=0)
    assert psa.latency(program(512)) == no_overlap.latency(program(512))
    assert psa.latency(program(9)) < 0.7 * no_overlap.latency(program(9))


def test_serial_program_costs_about_cores_times_more():
    # compute bound: only the kernel-level penalty differs (the copy out of C_local is serial in both)
    ratio = latency(gmm_program(parallel=1)) / latency(gmm_program())
    assert 0.9 * HW.cores < ratio <= HW.cores


def test_incomplete_program_is_infinitely_slow():
    sketch = generate_sketches(gmm())[0]  # split lengths still unfilled
    assert StaticAnalyzer(HW).latency(sketch) == math.inf


def test_prefilter_keeps_psa_best_and_a_random_share(monkeypatch):
    task = gmm()
    policy = SketchPolicy.from_options(task, RandomModel(0), prefilter="psa", init_population=10, prefilter_pool=4,
                          prefilter_random=0.2, workers=1)
    pool = policy.evolution.sample(40)
    monkeypatch.setattr(policy.evolution, "sample", lambda n: pool[:n])
    lat = policy.prefilter.latencies(pool)
    kept = policy._sample()
    assert len(kept) == 10
    best = [pool[i] for i in np.argsort(lat, kind="stable")[:8]]
    assert kept[:8] == best
    assert all(s not in best for s in kept[8:])  # the random share comes from the pruned rest
    batch = policy.next_batch(6)
    assert len({s.steps for s in batch}) == 6


def test_prefilter_must_be_known():
    with pytest.raises(ValueError, match="prefilter must be 'psa'"):
        SketchPolicy.from_options(gmm(), RandomModel(0), prefilter="roofline")


def test_lazy_state_pickles_as_the_plain_program_without_its_replayer():
    task = gmm()
    done = SketchPolicy.from_options(task, RandomModel(0), workers=1).evolution.sample(8)
    for s in done:  # fill the replayer's prefix cache
        _ = LazyState(task.replayer, s.steps).stages
    lazy = LazyState(task.replayer, done[0].steps)
    back = pickle.loads(pickle.dumps(lazy))
    assert type(back) is State and back.steps == done[0].steps and str(back) == str(done[0])
    assert len(pickle.dumps(lazy)) <= len(pickle.dumps(back)) + 64  # no replayer inside


def test_an_innermost_reduction_over_contiguous_reads_is_estimated_as_vectors():
    """codegen.vector sums a row over vectors of partial sums; a column (stride N) stays scalar, and so one lane per
    instruction in the estimate."""
    x = te.placeholder((N, N), name="x")
    k = te.reduce_axis(N, "k")
    rows = te.compute((N,), lambda i: te.sum(x[i, k], axis=k), name="rows")
    cols = te.compute((N,), lambda i: te.sum(x[k, i], axis=k), name="cols")
    assert latency(State([x, cols])) > 0.8 * HW.float_lanes * latency(State([x, rows]))
