"""Pruner's PSA for CUDA kernels (costmodel.psa_gpu): programs that differ in one of the paper's terms are ordered the
way the term says, on GPU matmul schedules (examples.gpu_gmm_state) for an H100; the analyzer is the one cuda tasks
get, and it is fast."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from tensorgen import te
from tensorgen.costmodel.analyzers import static_analyzer
from tensorgen.costmodel.psa import StaticAnalyzer, statement_stacks
from tensorgen.costmodel.psa_gpu import GpuStaticAnalyzer, Kernels, RegisterTile
from tensorgen.dag import ComputeDAG
from tensorgen.errors import LoweringError
from tensorgen.examples import gpu_gmm_state
from tensorgen.features.ansor import features_of
from tensorgen.features.layout import GPU_AXES, INDEX
from tensorgen.features.nest import program_statements
from tensorgen.hardware import hardware_for
from tensorgen.schedule.state import State
from tensorgen.target import Target
from tensorgen.task import SearchTask

HW = hardware_for("cuda -device=h100")
PSA = GpuStaticAnalyzer(HW)


def gmm(m: int = 1024, n: int = 1024, k: int = 1024, **knobs) -> State:
    return gpu_gmm_state(m, n, k, **{"threads": (16, 16), "thread_tile": (4, 4), **knobs})


def latency(state: State, psa: GpuStaticAnalyzer = PSA) -> float:
    return psa.latency(state)


def kernel(state: State, psa: GpuStaticAnalyzer = PSA) -> Kernels:
    """The (single) kernel of `state` as the analyzer sees it."""
    programs = [program_statements(state, gpu=True)]
    groups = statement_stacks(programs)
    (ids,) = psa._kernel_ids(programs)
    kid = [np.array([ids[k] for k in g.statement]) for g in groups]
    return psa.kernels(groups, kid, [RegisterTile.of(g, psa.unroll) for g in groups], max(ids) + 1)


def test_one_thread_per_block_costs_a_warp_of_lanes():
    """P_warp: a block of 1 thread fills 1 of its warp's 32 lanes; 128 threads fill 4 warps, 32 threads a warp
    (more resident warps per SM past what keeps it busy gain nothing)."""
    one, warp, many = (latency(gmm(threads=t)) for t in ((1, 1), (8, 4), (16, 8)))
    assert one > 20 * many
    assert one > 10 * warp and many < warp


def test_a_block_just_over_a_wave_costs_about_a_wave_more():
    """P_kernel: 64-thread blocks, 32 resident per SM, so 132 x 32 blocks are one wave on an H100; 33 columns of
    blocks instead of 32 are 3% more work and a second wave, 31 are a partial wave of 97%."""
    assert kernel(gmm(1056, 256, 2048, threads=(8, 8), thread_tile=(1, 1))).occupancy[0] == 32
    under, full, over = (latency(gmm(1056, n, 2048, threads=(8, 8), thread_tile=(1, 1))) for n in (248, 256, 264))
    assert under < full and under / full == pytest.approx(31 / 32, rel=0.01)
    assert over / full > 1.4


def test_a_register_tile_over_the_registers_is_penalized():
    """P_reg: a 16 x 16 tile needs 256 accumulators besides its operands, over the 255 registers a thread has; an 8 x
    8 one fits. The block covers the same 128 x 128 of C."""
    big, fits = kernel(gmm(threads=(8, 8), thread_tile=(16, 16))), kernel(gmm(threads=(16, 16), thread_tile=(8, 8)))
    assert big.registers[0] > HW.registers_per_thread >= fits.registers[0]
    assert big.p_reg[0] > 1 and fits.p_reg[0] == 1
    assert latency(gmm(threads=(8, 8), thread_tile=(16, 16))) > 2 * latency(gmm(threads=(16, 16), thread_tile=(8, 8)))


def test_a_larger_register_tile_loads_less_per_update():
    """alpha: nvcc unrolls the 4 x 4 x 8 tile, loading 32 + 32 operands for 128 updates (alpha 1.5); a 1 x 1 x 8
    one loads 2 per update (alpha 3)."""
    assert latency(gmm(thread_tile=(4, 4))) < latency(gmm(thread_tile=(1, 1)))


def test_an_uncoalesced_fetch_moves_more_sectors():
    """P_mem: threads fetching the shared tiles down their columns read one float of each 32-byte sector."""
    assert latency(gmm(fetch_by_columns=True)) > 1.5 * latency(gmm())


def test_a_fetch_by_fewer_threads_than_the_block_idles_lanes():
    """P_warp of a statement: a cooperative fetch by 64 of the block's 256 threads leaves 3 of 4 warps idle."""
    assert latency(gmm(fetch_threads=64)) > latency(gmm())


def test_less_shared_memory_per_sm_lowers_occupancy_and_adds_waves():
    """Occupancy: 8 KiB of shared tiles per block; an SM with 228 KiB holds 21 blocks (registers limit it), more than
    the 8 each SM needs for 1024 blocks in one wave, one with 24 or 12 KiB 3 or 1 (3 or 8 waves); a block over the 48
    KiB a block may have cannot run."""
    s = gmm(threads=(8, 8), k_tile=32)
    full, small, tiny = (GpuStaticAnalyzer(HW.replace(l1_bytes=kib * 1024)) for kib in (228, 24, 12))
    assert [kernel(s, p).occupancy[0] for p in (full, small, tiny)] == [21, 3, 1]
    assert latency(s, full) < latency(s, small) < latency(s, tiny)
    assert kernel(gmm(k_tile=128)).shared[0] > HW.shared_mem_per_block and math.isinf(latency(gmm(k_tile=128)))


def test_cuda_tasks_get_the_gpu_analyzer_and_gpu_features():
    """The analyzer is chosen per target kind; the features of a GPU program carry its binding lengths."""
    dag = ComputeDAG([te.ops.matmul(te.placeholder((64, 64), name="A"), te.placeholder((64, 64), name="B"))])
    cuda = SearchTask(dag, Target.parse("cuda -device=h100"), HW)
    cpu = SearchTask(dag, Target.parse("cpu"), hardware_for("cpu -cores=2"))
    assert type(static_analyzer(cuda)) is GpuStaticAnalyzer and type(static_analyzer(cpu)) is StaticAnalyzer
    s = gmm(256, 256, 256, vthreads=(2, 1))
    with pytest.raises(LoweringError):
        program_statements(s)
    f = features_of(program_statements(s, gpu=True), HW, log=False)
    lengths = f[:, [INDEX[a] for a in GPU_AXES]]
    assert (lengths == [8, 1, 1, 256, 1, 1, 2]).all()


def test_the_analyzer_is_vectorized():
    """512 programs (128 schedules, 4 times) in one call: the analyzer alone takes well under a millisecond per
    program (its statements come from lowering, ~5 ms each, cached by the search's extractor)."""
    knobs = itertools.product([(8, 8), (16, 8), (16, 16), (32, 4)], [(1, 1), (2, 2), (4, 4), (8, 4)],
                              [(1, 1), (2, 1)], [8, 16], [None, 64])
    programs = [program_statements(gmm(threads=t, thread_tile=tt, vthreads=v, k_tile=kt, fetch_threads=f), gpu=True)
                for t, tt, v, kt, f in knobs]
    assert len(programs) == 128
    batch = programs * 4
    PSA.program_latencies(batch[:8])
    t0 = time.perf_counter()
    out = PSA.program_latencies(batch)
    per_program = (time.perf_counter() - t0) / len(batch)
    assert np.isfinite(out).all() and per_program < 1e-3, per_program
    np.testing.assert_allclose(out[:128], [PSA.program_latencies([p])[0] for p in programs])
