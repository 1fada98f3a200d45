"""CUDA sources in the form the CUDA generator emits, run by the CPU emulation (codegen.cuda_emu) and checked
against NumPy; the same sources compiled by nvcc where it is installed, and run on a GPU where there is one."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from cuda_run import PRELUDE, library, run

from tensorgen.codegen import toolchain
from tensorgen.codegen.cuda_toolchain import compile_cuda, compile_emulated, cuda_preflight, emulation_preflight
from tensorgen.errors import CompileError, DeviceError, RuntimeCallError, ToolchainError
from tensorgen.runtime.cuda import CudaLibrary, cuda_available, cudart

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
needs_gpu = pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU")
no_gpu = pytest.mark.skipif(cuda_available(), reason="a CUDA GPU is present")

ELEMENTWISE = r"""
static __device__ inline float max_float32(float a, float b) { return a > b ? a : b; }

extern "C" __global__ void __launch_bounds__(128) relu2_kernel0(const float* __restrict__ x, float* __restrict__ y) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < 10007; i += blockDim.x * gridDim.x) {
    y[i] = max_float32(x[i], 0.0f) * 2.0f + max(x[i], -1.0f);
  }
}
extern "C" __global__ void __launch_bounds__(128) total_kernel0(const float* __restrict__ x, float* __restrict__ out) {
  __shared__ float partial[128];
  float s = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < 10007; i += blockDim.x * gridDim.x) s += x[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int half = 64; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}
extern "C" int relu2(const float* x, float* y) {
  TG_LAUNCH(relu2_kernel0, dim3(8, 1, 1), dim3(128, 1, 1), x, y);
  return (int)cudaGetLastError();
}
extern "C" int total(const float* x, float* out) {
  cudaMemset(out, 0, sizeof(float));
  TG_LAUNCH(total_kernel0, dim3(8, 1, 1), dim3(128, 1, 1), x, out);
  return (int)cudaGetLastError();
}
"""

# 64x48 @ 48x40 in 16x16 tiles: a 3x4 grid of 16x16 blocks, guarded at the right edge (40 = 2.5 tiles).
MATMUL = r"""
extern "C" __global__ void __launch_bounds__(256) matmul_kernel0(const float* __restrict__ A,
                                                                const float* __restrict__ B, float* __restrict__ C) {
  __shared__ float A_shared[256];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * 16 + ty, col = blockIdx.x * 16 + tx;
  float C_local[1];
  C_local[0] = 0.0f;
  for (int k0 = 0; k0 < 48; k0 += 16) {
    __shared__ float B_shared[256];
    A_shared[ty * 16 + tx] = row < 64 ? A[row * 48 + k0 + tx] : 0.0f;
    B_shared[ty * 16 + tx] = col < 40 ? B[(k0 + ty) * 40 + col] : 0.0f;
    SYNC_FETCHED
    for (int k = 0; k < 16; k++) C_local[0] += A_shared[ty * 16 + k] * B_shared[k * 16 + tx];
    SYNC_USED
  }
  if (row < 64 && col < 40) C[row * 40 + col] = C_local[0];
}
extern "C" int matmul(const float* A, const float* B, float* C) {
  TG_LAUNCH(matmul_kernel0, dim3(3, 4, 1), dim3(16, 16, 1), A, B, C);
  return (int)cudaGetLastError();
}
"""
SYNC = "__syncthreads();"

GRID = r"""
extern "C" __global__ void __launch_bounds__(16) where_kernel0(int* __restrict__ out) {
  const int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const int thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  int* o = out + (block * blockDim.x * blockDim.y * blockDim.z + thread) * 8;
  o[0] = blockIdx.x; o[1] = blockIdx.y; o[2] = blockIdx.z;
  o[3] = threadIdx.x; o[4] = threadIdx.y; o[5] = threadIdx.z;
  o[6] = min(gridDim.x * 100 + gridDim.y * 10 + gridDim.z, 1000);  // CUDA's min(unsigned, int)
  const float4 d = make_float4(blockDim.x * 100.0f, blockDim.y * 10.0f, blockDim.z, 0.0f);
  o[7] = (int)max(d.x + d.y + d.z, 1.0);  // CUDA's max(float, double)
}
extern "C" int where(int* out) {
  TG_LAUNCH(where_kernel0, dim3(2, 3, 4), dim3(4, 2, 2), out);
  return (int)cudaGetLastError();
}
"""

# Two launches in order through a device workspace; the second reads what other blocks of the first wrote.
WORKSPACE = r"""
extern "C" __global__ void __launch_bounds__(256) scale_add_kernel0(const float* __restrict__ A,
                                                                   float* __restrict__ T) {
  const int i = blockIdx.x * 256 + threadIdx.x;
  if (i < 1000) T[i] = A[i] * 2.0f;
}
extern "C" __global__ void __launch_bounds__(256) scale_add_kernel1(const float* __restrict__ T,
                                                                   const float* __restrict__ B, float* __restrict__ C) {
  const int i = blockIdx.x * 256 + threadIdx.x;
  if (i < 1000) C[i] = T[999 - i] + B[i];
}
static float* scale_add_T_workspace(void) { static float* p; if (!p) cudaMalloc((void**)&p, 4000); return p; }
extern "C" int scale_add(const float* A, const float* B, float* C) {
  float* T = scale_add_T_workspace();
  TG_LAUNCH(scale_add_kernel0, dim3(4, 1, 1), dim3(256, 1, 1), A, T);
  TG_LAUNCH(scale_add_kernel1, dim3(4, 1, 1), dim3(256, 1, 1), T, B, C);
  return (int)cudaGetLastError();
}
"""

# Undefined or invalid on a GPU: the emulation reports them as errors instead.
FAULTS = r"""
extern "C" __global__ void __launch_bounds__(128) exit_early_kernel0(float* __restrict__ x) {
  if (threadIdx.x >= 100) return;
  x[threadIdx.x] = 1.0f;
  __syncthreads();
  x[threadIdx.x] += x[99 - threadIdx.x];
}
extern "C" __global__ void __launch_bounds__(128) split_barrier_kernel0(float* __restrict__ x) {
  if (threadIdx.x % 2 == 0) {
    x[threadIdx.x] = 1.0f;
    __syncthreads();
  } else {
    x[threadIdx.x] = 2.0f;
    __syncthreads();
  }
}
extern "C" __global__ void fill_kernel0(float* __restrict__ x) { x[blockIdx.x * blockDim.x + threadIdx.x] = 3.0f; }
extern "C" int exit_early(float* x) {
  TG_LAUNCH(exit_early_kernel0, dim3(1, 1, 1), dim3(128, 1, 1), x);
  return (int)cudaGetLastError();
}
extern "C" int split_barrier(float* x) {
  TG_LAUNCH(split_barrier_kernel0, dim3(1, 1, 1), dim3(128, 1, 1), x);
  return (int)cudaGetLastError();
}
extern "C" int too_many_threads(float* x) {
  TG_LAUNCH(fill_kernel0, dim3(1, 1, 1), dim3(2048, 1, 1), x);
  return (int)cudaGetLastError();
}
extern "C" int fill(float* x) {
  TG_LAUNCH(fill_kernel0, dim3(16, 1, 1), dim3(128, 1, 1), x);
  return (int)cudaGetLastError();
}
"""


def matmul_source(sync_fetched: str = SYNC, sync_used: str = SYNC) -> str:
    return PRELUDE + MATMUL.replace("SYNC_FETCHED", sync_fetched).replace("SYNC_USED", sync_used)


def small_ints(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Integer-valued floats: every sum of products is exact, so results compare for equality."""
    return rng.integers(-3, 4, shape).astype(np.float32)


@pytest.fixture(params=[True, pytest.param(False, marks=needs_gpu)], ids=["emulated", "gpu"])
def emulate(request: pytest.FixtureRequest) -> bool:
    return request.param


def test_grid_stride_elementwise_and_atomic_reduction(emulate: bool) -> None:
    x = np.random.default_rng(0).standard_normal(10007).astype(np.float32)
    y, out = np.zeros_like(x), np.zeros(1, np.float32)
    run(PRELUDE + ELEMENTWISE, "relu2", x, y, emulate=emulate)
    np.testing.assert_array_equal(y, np.maximum(x, 0) * 2 + np.maximum(x, -1))
    run(PRELUDE + ELEMENTWISE, "total", x, out, emulate=emulate)
    np.testing.assert_allclose(out[0], x.sum(dtype=np.float64), rtol=1e-5)


def test_tiled_matmul_with_shared_memory_equals_numpy(emulate: bool) -> None:
    rng = np.random.default_rng(1)
    a, b, c = small_ints(rng, 64, 48), small_ints(rng, 48, 40), np.full((64, 40), np.nan, np.float32)
    run(matmul_source(), "matmul", a, b, c, emulate=emulate)
    np.testing.assert_array_equal(c, a @ b)


@pytest.mark.parametrize("missing", ["after the fetch", "after the use"])
def test_a_missing_syncthreads_gives_a_wrong_result(missing: str) -> None:
    """Without the barrier after the fetch, threads read tiles others have not stored yet; without the one after
    the use, the next fetch overwrites a tile others still read. The emulation runs threads one after another
    between barriers, alternating the order, so either race changes the result."""
    source = matmul_source(sync_fetched="" if missing == "after the fetch" else SYNC,
                           sync_used="" if missing == "after the use" else SYNC)
    rng = np.random.default_rng(2)
    a, b, c = small_ints(rng, 64, 48), small_ints(rng, 48, 40), np.zeros((64, 40), np.float32)
    run(source, "matmul", a, b, c)
    assert not np.array_equal(c, a @ b)


def test_block_and_grid_indices_in_three_dimensions(emulate: bool) -> None:
    out = np.full((4, 3, 2, 2, 2, 4, 8), -1, np.int32)  # grid z, y, x, block z, y, x, fields
    run(PRELUDE + GRID, "where", out, emulate=emulate)
    gz, gy, gx, tz, ty, tx = np.indices(out.shape[:-1])
    np.testing.assert_array_equal(out[..., :6], np.stack([gx, gy, gz, tx, ty, tz], -1))
    assert (out[..., 6] == 234).all() and (out[..., 7] == 422).all()


def test_two_launches_through_a_device_workspace(emulate: bool) -> None:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    for _ in range(2):  # the second call reuses the workspace the first allocated
        c = np.zeros(1000, np.float32)
        run(PRELUDE + WORKSPACE, "scale_add", a, b, c, emulate=emulate)
        np.testing.assert_array_equal(c, a[::-1] * 2 + b)


def test_barrier_divergence_and_oversized_blocks_are_errors_and_the_library_goes_on() -> None:
    lib = library(PRELUDE + FAULTS)
    with lib.runtime.to_device(np.zeros(2048, np.float32)) as x:
        with pytest.raises(DeviceError, match=r"exit_early failed: CUDA error 719 \(barrier divergence in block "
                                              r"\(0, 0, 0\): thread \(0, 0, 0\) waits at __syncthreads .* has exited"):
            lib.entry("exit_early")(x)
        with pytest.raises(DeviceError, match=r"barrier divergence .* waits at __syncthreads \(line \d+\), "
                                              r"thread \(1, 0, 0\) at line \d+"):
            lib.entry("split_barrier")(x)
        x.copy_from(np.zeros(2048, np.float32))
        with pytest.raises(DeviceError, match=r"CUDA error 9 \(invalid configuration argument: fill_kernel0 launched "
                                              r"with block \(2048, 1, 1\) of 2048 threads"):
            lib.entry("too_many_threads")(x)
        assert not x.to_numpy().any()  # the kernel did not run
        lib.entry("fill")(x)  # errors are reported once (cudaGetLastError clears them)
        assert (x.to_numpy() == 3).all()


def test_timing_device_arrays_and_argument_errors() -> None:
    lib = library(PRELUDE + WORKSPACE)
    assert lib.emulated and "emulated" in repr(lib)
    rt = lib.runtime
    a, b, c = (rt.to_device(np.ones(1000, np.float32)) for _ in range(3))
    seconds = lib.entry("scale_add").time(a, b, c, runs=3)
    assert 0 < seconds < 1
    np.testing.assert_array_equal(c.to_numpy(), np.full(1000, 3, np.float32))
    with pytest.raises(RuntimeCallError, match="not a DeviceArray"):
        lib.entry("scale_add")(a, b, np.zeros(1000, np.float32))
    with pytest.raises(RuntimeCallError, match="exports no function 'nope'"):
        lib.entry("nope")
    with pytest.raises(RuntimeCallError, match=r"cannot copy float64\[3\] into device array float32\[1000\]"):
        a.copy_from(np.zeros(3))
    for arr in (a, b, c):
        arr.free()
    c.free()  # freeing twice is harmless
    with pytest.raises(RuntimeCallError, match="was freed"):
        c.to_numpy()


def test_emulated_builds_are_cached_and_errors_carry_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    source = PRELUDE + GRID
    first = compile_emulated(source)
    assert first.with_suffix(".cu").read_text() == source

    def boom(*args, **kwargs):
        raise AssertionError("compiler invoked on a cache hit")

    monkeypatch.setattr(toolchain, "run_group", boom)
    assert compile_emulated(source) == first
    monkeypatch.undo()
    with pytest.raises(CompileError, match="undeclared_thing") as info:
        compile_emulated(PRELUDE + GRID.replace("o[0] = blockIdx.x", "o[0] = undeclared_thing"))
    assert "undeclared_thing" in info.value.log and "undeclared_thing" in info.value.source


def test_emulation_preflight() -> None:
    emulation_preflight(again=True)


@no_gpu
def test_without_a_gpu_the_runtime_says_so_in_one_line() -> None:
    assert cuda_available() is False
    with pytest.raises(DeviceError) as info:
        cudart()
    assert len(str(info.value).splitlines()) == 1


@needs_nvcc
def test_nvcc_builds_the_matmul_and_the_preflight(tmp_path: Path) -> None:
    path = compile_cuda(matmul_source())
    assert path.with_suffix(".cu").read_text() == matmul_source()
    cuda_preflight(again=True)
    if not cuda_available():
        with pytest.raises(DeviceError, match="no CUDA GPU is usable") as info:
            CudaLibrary(path)
        assert len(str(info.value).splitlines()) == 1


@needs_nvcc
def test_nvcc_errors_carry_the_log_and_the_preflight_names_a_bad_arch() -> None:
    with pytest.raises(CompileError, match="undeclared_thing") as info:
        compile_cuda(PRELUDE + GRID.replace("o[0] = blockIdx.x", "o[0] = undeclared_thing"))
    assert "nvcc" in str(info.value) and "undeclared_thing" in info.value.log
    with pytest.raises(ToolchainError, match=r"cannot build a trivial kernel .*sm_1.*; check .* nvcc knows sm_1"):
        cuda_preflight("sm_1", again=True)
