"""The CUDA code generator (codegen.cuda) on GPU-bound schedules: kernels, launches, shared tiles and their barriers,
and the programs no GPU can run as written, refused with one line."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tensorgen import build, te
from tensorgen.codegen.cuda import launch_of, render_cuda, split_kernels
from tensorgen.codegen.cuda_toolchain import compile_cuda
from tensorgen.errors import LoweringError, RuntimeCallError
from tensorgen.examples import gpu_gmm_state
from tensorgen.hardware import hardware_for
from tensorgen.measure import ErrorKind, MeasureInput
from tensorgen.measure.builder import LocalBuilder
from tensorgen.measure.runner import LocalRunner
from tensorgen.runtime.cuda import cuda_available
from tensorgen.schedule.lower import lower
from tensorgen.schedule.state import State
from tensorgen.target import Target
from tensorgen.task import SearchTask
from tensorgen.te import ops


def two_stage_state() -> State:
    """B = 2A over a fused, bound loop, then C[i] = B[i, 0] + B[i, 29]: two kernels, B in a device workspace."""
    a = te.placeholder((50, 30), name="A")
    b = te.compute((50, 30), lambda i, j: a[i, j] * 2.0, name="B")
    c = te.compute((50,), lambda i: b[i, 0] + b[i, 29], name="C")
    s = State(c).fuse("B", ["i", "j"]).split("B", "i_j_f", [128])
    s = s.bind("B", "i_j_f_0", "blockIdx.x").bind("B", "i_j_f_1", "threadIdx.x")
    return s.split("C", "i", [32]).bind("C", "i_0", "blockIdx.x").bind("C", "i_1", "threadIdx.x")


def test_gpu_bindings_need_a_cuda_target():
    with pytest.raises(LoweringError, match="is bound to threadIdx.x; GPU bindings need a CUDA target"):
        lower(gpu_gmm_state(64, 40, 48))


def test_a_tiled_matmul_is_one_kernel_with_shared_tiles_between_barriers():
    func = lower(gpu_gmm_state(64, 40, 48, threads=(8, 8), thread_tile=(2, 1), k_tile=12), "gmm", gpu=True)
    _, nests = split_kernels(func.body)
    assert len(nests) == 1
    launch = launch_of(nests[0])
    assert launch.block == (64, 1, 1) and launch.grid == (4 * 5, 1, 1)  # 64/16 row blocks x 40/8 column blocks
    source = render_cuda(func)
    assert "__launch_bounds__(64) gmm_kernel0(" in source
    # the block's rows of A (16 x k_tile) and columns of B (k_tile x 8), whatever thread reads them
    assert "__shared__ float A_shared[192];" in source and "__shared__ float B_shared[96];" in source
    assert source.count("__syncthreads();") == 2
    assert "float C_local[2];" in source
    assert "TG_LAUNCH(gmm_kernel0, dim3(20, 1, 1), dim3(64, 1, 1), B, A, C);" in source


def test_every_root_stage_is_a_kernel_and_intermediates_live_in_device_workspaces():
    source = render_cuda(lower(two_stage_state(), "two", gpu=True))
    assert "two_kernel0(const float* __restrict__ A, float* __restrict__ B)" in source
    assert "two_kernel1(float* __restrict__ C, const float* __restrict__ B)" in source
    assert "cudaMalloc((void**)&buffer, 6144)" in source  # 50 x 30 floats, to 256 bytes
    host = source[source.index('extern "C" int two('):]
    assert host.index("two_kernel0") < host.index("two_kernel1")


def test_programs_no_gpu_runs_are_refused_in_one_line():
    with pytest.raises(LoweringError, match="blocks of 2048 threads"):
        render_cuda(lower(gpu_gmm_state(128, 64, 64, threads=(64, 32), thread_tile=(1, 1)), "big", gpu=True))
    with pytest.raises(LoweringError, match="shared memory of .* bytes .*a block may use 512"):
        render_cuda(lower(gpu_gmm_state(64, 40, 48), "gmm", gpu=True), shared_bytes=512)
    # 64 threads compute and 128 fetch: the block has 128, and half of them would skip the fetch's barriers
    s = gpu_gmm_state(64, 40, 48, threads=(8, 8), thread_tile=(2, 1), fetch_threads=128)
    with pytest.raises(LoweringError, match="barrier would hang"):
        render_cuda(lower(s, "gmm", gpu=True))
    # fewer fetching threads than the block's are fine: the barriers are outside the fetch loop
    assert "__syncthreads" in render_cuda(lower(gpu_gmm_state(64, 40, 48, fetch_threads=32), "gmm", gpu=True))


# ---- generated CUDA run under the emulator (codegen.cuda_emu), against NumPy --------------------------------

EMULATED = "cuda -emulate=1"


ON_GPU = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="no GPU")])


@pytest.mark.parametrize("target", [EMULATED, ON_GPU])
@pytest.mark.parametrize("seed", range(6))
def test_random_tilings_of_the_gpu_matmul_equal_numpy(seed, target):
    """Shapes that the tiles do not divide, random thread counts, tiles per thread, virtual threads, k steps
    and fetching threads: every program computes A @ B (under the emulator, and on a GPU where there is one)."""
    rng = np.random.default_rng(seed)
    m, n, k = (int(v) for v in rng.integers(5, 70, 3))
    threads = tuple(int(rng.choice([t for t in (1, 2, 4, 8, 16) if t <= e])) for e in (m, n))
    tile = tuple(int(rng.integers(1, 4)) for _ in "ij")
    vthreads = tuple(int(rng.choice([1, 2])) if t * tl * 2 <= e else 1 for t, tl, e in zip(threads, tile, (m, n)))
    k_tile = int(rng.integers(1, k + 1))
    fetch = int(rng.choice([32, threads[0] * threads[1]])) if threads[0] * threads[1] >= 32 else None
    state = gpu_gmm_state(m, n, k, threads, tile, vthreads, k_tile, fetch)
    f = build(state, target=target)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    (c,) = f.run(*(a if t.name == "A" else b for t in f.dag.args[:2]))
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_stages_without_bindings_are_spread_over_threads():
    x = te.placeholder((37, 50), name="x")
    f = build(ops.softmax(x, axis=1), target=EMULATED)
    assert "blockIdx.x" in f.source and f.source.count("__global__") == 4  # max, exp, sum, divide
    a = np.random.default_rng(0).standard_normal((37, 50), dtype=np.float32)
    ref = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(f.run(a)[0], ref / ref.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    with pytest.raises(RuntimeCallError, match="x must be a float32\\[37, 50\\] array, got float64\\[37, 50\\]"):
        f.run(a.astype(np.float64))


def test_an_intermediate_in_a_device_workspace_survives_between_kernels_and_calls():
    f = build(two_stage_state(), target=EMULATED)
    for seed in range(2):
        a = np.random.default_rng(seed).standard_normal((50, 30), dtype=np.float32)
        np.testing.assert_allclose(f.run(a)[0], 2 * a[:, 0] + 2 * a[:, 29], rtol=1e-6)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_compiles_the_generated_matmul():
    source = render_cuda(lower(gpu_gmm_state(37, 29, 51, vthreads=(2, 1)), "gmm", gpu=True))
    assert compile_cuda(source).is_file()


def oversized_launch(inp: MeasureInput, source: str) -> str:
    """A builder source hook: the second candidate launches blocks of 2048 threads, which CUDA refuses."""
    return source.replace("dim3(64, 1, 1)", "dim3(2048, 1, 1)") if inp.task.desc == "broken" else source


def test_the_runner_times_and_checks_an_emulated_cuda_candidate():
    """The harness's CUDA path (arguments in device memory, every call synchronized and its error checked),
    with correctness against the naive program run on the CPU; a launch CUDA refuses is a runtime error."""
    state = gpu_gmm_state(40, 24, 16)
    good = SearchTask(state.dag, Target.parse(EMULATED), hardware_for(EMULATED))
    broken = SearchTask(state.dag, good.target, good.hw, "broken")
    inputs = [MeasureInput(good, state), MeasureInput(broken, state)]
    with LocalBuilder(n_parallel=1, source_hook=oversized_launch) as builder:
        built = builder.build(inputs)
    ok, bad = LocalRunner(check_correctness=True, number=1, repeat=2).run(inputs, built)
    assert ok.error_kind == ErrorKind.NONE and len(ok.costs) == 2, ok.error_msg
    assert bad.error_kind == ErrorKind.RUNTIME_ERROR and "CUDA error 9" in bad.error_msg, bad.error_msg


def test_emulated_candidates_are_never_killed_or_given_up_for_slowness():
    """Emulated times count the emulator's thread switches, not a GPU's speed: the runner's limits relative to the
    fastest candidate (timeout_factor, give_up_factor) do not apply to them."""
    state = gpu_gmm_state(40, 24, 16)
    runner = LocalRunner(timeout=10.0, timeout_factor=20.0, give_up_factor=8.0)
    for target, limited in ((EMULATED, False), ("cpu", True)):
        task = SearchTask(state.dag, Target.parse(target), hardware_for(target))
        runner.note_fastest(task, 1e-4)
        assert (runner.timeout_for(task) < 10.0) == limited and (runner.give_up_after(task) > 0) == limited
