"""The CUDA code generator (codegen.cuda) on GPU-bound schedules: kernels, launches, shared tiles and their barriers,
and the programs no GPU can run as written, refused with one line."""

from __future__ import annotations

import pytest

from tensorgen import te
from tensorgen.codegen.cuda import launch_of, render_cuda, split_kernels
from tensorgen.errors import LoweringError
from tensorgen.examples import gpu_gmm_state
from tensorgen.schedule.lower import lower
from tensorgen.schedule.state import State


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
