"""A C++ header that runs generated CUDA on the CPU with CUDA's semantics, to check CUDA code where no GPU is.

Compiled with `g++ -include <header> -DTENSORGEN_CUDA_EMULATION` (`cuda_toolchain.compile_emulated`), a source in
the form the CUDA generator emits becomes a shared library whose host entry points take "device" pointers that
are host pointers. Each CUDA thread of a block runs as a fiber (ucontext) on a stack of its own; `__syncthreads()`
switches back to a scheduler that runs every fiber of the block to the barrier, then all onward, in alternating
order (forward, then reverse), so that a missing barrier shows up as a wrong result rather than by luck. Blocks
run one after another, so `__shared__` is a function-local static: one instance, fresh per block in effect.

Errors a GPU would report (a block over 1024 threads, a grid out of range) and barrier divergence (some threads
exit or wait at another `__syncthreads` while others wait at one: undefined on a GPU) set the error that
`cudaGetLastError()` returns; the grid stops at the failing block. The library also exports the runtime API the
Python runtime (`tensorgen.runtime.cuda`) binds (cudaMalloc, cudaMemcpy, events, ...) and the marker
`tensorgen_cuda_emulation` by which it tells an emulated library from one built by nvcc.

Not emulated: warp-level operations (shuffles, votes, `__syncwarp`), dynamic shared memory (`extern __shared__`),
streams other than the default, cooperative groups, `__launch_bounds__` and shared-memory size limits (nvcc checks
the latter when it compiles; a launch with more threads than the bounds fails only on a GPU).
"""

from __future__ import annotations

import hashlib

#: The header text; the CUDA generator's sources are compiled with it via `-include`.
HEADER = r"""// tensorgen CUDA emulation: generated CUDA compiled as C++ for the CPU (tensorgen/codegen/cuda_emu.py).
#pragma once
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <mutex>
#include <tuple>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static

struct uint3 { unsigned int x, y, z; };
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

#define __align__(n) __attribute__((aligned(n)))
struct __align__(8) float2 { float x, y; };
struct __align__(16) float4 { float x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};
typedef enum cudaError cudaError_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
struct CUevent_st { double seconds; };

static const int warpSize = 32;

namespace {
namespace tg_emu {

constexpr unsigned kMaxThreads = 1024;
constexpr size_t kStackBytes = 128 * 1024;

enum class FiberState { Ready, AtBarrier, Done };

struct Fiber {
  ucontext_t context;
  uint3 thread_idx;
  FiberState state;
  int barrier_line;
};

struct Emulator {
  Fiber fibers[kMaxThreads];
  char* stacks = nullptr;  // `capacity` stacks, each above a guard page
  size_t capacity = 0;
  size_t page = 0;
  ucontext_t scheduler;
  Fiber* current = nullptr;
  uint3 block_idx{0, 0, 0};
  dim3 block_dim, grid_dim;
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  cudaError_t error = cudaSuccess;   // pending, for cudaGetLastError
  cudaError_t described = cudaSuccess;  // the error `message` describes
  char message[320] = "";
  std::mutex launching;
};
Emulator emu;

cudaError_t fail(cudaError_t code, const char* format, ...) __attribute__((format(printf, 2, 3)));
cudaError_t fail(cudaError_t code, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(emu.message, sizeof emu.message, format, args);
  va_end(args);
  emu.error = emu.described = code;
  return code;
}

size_t slot_bytes() { return kStackBytes + emu.page; }

bool reserve_stacks(size_t n) {
  if (n <= emu.capacity) return true;
  if (emu.stacks) munmap(emu.stacks, emu.capacity * slot_bytes());
  emu.page = (size_t)sysconf(_SC_PAGESIZE);
  void* p = mmap(nullptr, n * slot_bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    emu.stacks = nullptr;
    emu.capacity = 0;
    return false;
  }
  emu.stacks = static_cast<char*>(p);
  emu.capacity = n;
  for (size_t i = 0; i < n; i++) mprotect(emu.stacks + i * slot_bytes(), emu.page, PROT_NONE);  // overflow faults
  return true;
}

void fiber_main() {
  emu.body(emu.body_arg);
  emu.current->state = FiberState::Done;
}  // returns to uc_link: the scheduler

inline void barrier(int line) {
  Fiber* self = emu.current;
  self->state = FiberState::AtBarrier;
  self->barrier_line = line;
  __asm__ __volatile__("" ::: "memory");
  swapcontext(&self->context, &emu.scheduler);
  __asm__ __volatile__("" ::: "memory");
}

// Runs every thread of block `emu.block_idx` to completion; false (and the error set) on barrier divergence.
bool run_block(unsigned n) {
  const dim3 b = emu.block_dim;
  for (unsigned i = 0; i < n; i++) {
    Fiber& f = emu.fibers[i];
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = emu.stacks + i * slot_bytes() + emu.page;
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &emu.scheduler;
    makecontext(&f.context, fiber_main, 0);
    f.thread_idx = uint3{i % b.x, i / b.x % b.y, i / (b.x * b.y)};
    f.state = FiberState::Ready;
  }
  for (bool forward = true;; forward = !forward) {
    for (unsigned k = 0; k < n; k++) {
      Fiber& f = emu.fibers[forward ? k : n - 1 - k];
      emu.current = &f;
      swapcontext(&emu.scheduler, &f.context);
    }
    const Fiber* waiting = nullptr;  // fibers stop only at a barrier or at their end
    for (unsigned i = 0; i < n && !waiting; i++)
      if (emu.fibers[i].state == FiberState::AtBarrier) waiting = &emu.fibers[i];
    if (!waiting) return true;
    const Fiber* other = nullptr;  // one that has exited, or waits at another barrier
    for (unsigned i = 0; i < n && !other; i++) {
      const Fiber& f = emu.fibers[i];
      if (f.state == FiberState::Done || f.barrier_line != waiting->barrier_line) other = &f;
    }
    if (other) {
      const uint3 w = waiting->thread_idx, o = other->thread_idx, blk = emu.block_idx;
      if (other->state == FiberState::Done)
        fail(cudaErrorLaunchFailure, "barrier divergence in block (%u, %u, %u): thread (%u, %u, %u) waits at "
             "__syncthreads (line %d) but thread (%u, %u, %u) has exited", blk.x, blk.y, blk.z, w.x, w.y, w.z,
             waiting->barrier_line, o.x, o.y, o.z);
      else
        fail(cudaErrorLaunchFailure, "barrier divergence in block (%u, %u, %u): thread (%u, %u, %u) waits at "
             "__syncthreads (line %d), thread (%u, %u, %u) at line %d", blk.x, blk.y, blk.z, w.x, w.y, w.z,
             waiting->barrier_line, o.x, o.y, o.z, other->barrier_line);
      return false;
    }
    for (unsigned i = 0; i < n; i++) emu.fibers[i].state = FiberState::Ready;
  }
}

bool valid_launch(const char* kernel, dim3 grid, dim3 block) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    fail(cudaErrorInvalidConfiguration, "invalid configuration argument: %s launched with grid (%u, %u, %u), "
         "block (%u, %u, %u): no dimension may be 0", kernel, grid.x, grid.y, grid.z, block.x, block.y, block.z);
    return false;
  }
  if (threads > kMaxThreads || block.x > 1024 || block.y > 1024 || block.z > 64) {
    fail(cudaErrorInvalidConfiguration, "invalid configuration argument: %s launched with block (%u, %u, %u) of "
         "%llu threads; at most 1024 threads, (1024, 1024, 64) per dimension", kernel, block.x, block.y, block.z,
         threads);
    return false;
  }
  if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    fail(cudaErrorInvalidConfiguration, "invalid configuration argument: %s launched with grid (%u, %u, %u); at "
         "most (2147483647, 65535, 65535)", kernel, grid.x, grid.y, grid.z);
    return false;
  }
  return true;
}

template <class... P>
struct Call {
  void (*kernel)(P...);
  std::tuple<P...> args;
  static void invoke(void* self) {
    Call* call = static_cast<Call*>(self);
    std::apply(call->kernel, call->args);
  }
};

// Runs `kernel` over the whole grid, block after block (x fastest), with `args` converted to its parameters once.
template <class... P, class... A>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, std::tuple<A...> args) {
  std::lock_guard<std::mutex> hold(emu.launching);
  if (!valid_launch(name, grid, block)) return;
  const unsigned n = block.x * block.y * block.z;
  if (!reserve_stacks(n)) {
    fail(cudaErrorMemoryAllocation, "out of memory: no stacks for the %u threads of a block of %s", n, name);
    return;
  }
  Call<P...> call{kernel, std::tuple<P...>(std::move(args))};
  emu.body = &Call<P...>::invoke;
  emu.body_arg = &call;
  emu.grid_dim = grid;
  emu.block_dim = block;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        emu.block_idx = uint3{x, y, z};
        if (!run_block(n)) return;
      }
}

double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

}  // namespace tg_emu
}  // namespace

#define threadIdx (static_cast<const uint3&>(tg_emu::emu.current->thread_idx))
#define blockIdx (static_cast<const uint3&>(tg_emu::emu.block_idx))
#define blockDim (static_cast<const dim3&>(tg_emu::emu.block_dim))
#define gridDim (static_cast<const dim3&>(tg_emu::emu.grid_dim))
#define __syncthreads() tg_emu::barrier(__LINE__)
#define TG_LAUNCH(kernel, grid, block, ...) \
  tg_emu::launch(#kernel, kernel, (grid), (block), std::make_tuple(__VA_ARGS__))

// Device functions: fibers share one CPU thread, so atomics are plain read-modify-writes.
static inline void __threadfence() { __asm__ __volatile__("" ::: "memory"); }
static inline void __threadfence_block() { __asm__ __volatile__("" ::: "memory"); }
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T tg_atomic_add(T* p, T v) { T old = *p; *p = old + v; return old; }
static inline float atomicAdd(float* p, float v) { return tg_atomic_add(p, v); }
static inline double atomicAdd(double* p, double v) { return tg_atomic_add(p, v); }
static inline int atomicAdd(int* p, int v) { return tg_atomic_add(p, v); }
static inline unsigned int atomicAdd(unsigned int* p, unsigned int v) { return tg_atomic_add(p, v); }
// CUDA's min/max overloads, mixed ones included (int with unsigned is unsigned, float with double is double).
#define TG_MIN_MAX(R, A, B, LESS) \
  static inline R min(A a, B b) { return LESS((R)a, (R)b) ? (R)a : (R)b; } \
  static inline R max(A a, B b) { return LESS((R)b, (R)a) ? (R)a : (R)b; }
#define TG_LESS(a, b) ((a) < (b))
TG_MIN_MAX(int, int, int, TG_LESS)
TG_MIN_MAX(unsigned int, unsigned int, unsigned int, TG_LESS)
TG_MIN_MAX(unsigned int, int, unsigned int, TG_LESS)
TG_MIN_MAX(unsigned int, unsigned int, int, TG_LESS)
TG_MIN_MAX(long long, long long, long long, TG_LESS)
TG_MIN_MAX(unsigned long long, unsigned long long, unsigned long long, TG_LESS)
#undef TG_LESS
#undef TG_MIN_MAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline double min(float a, double b) { return fmin(a, b); }
static inline double max(float a, double b) { return fmax(a, b); }
static inline double min(double a, float b) { return fmin(a, b); }
static inline double max(double a, float b) { return fmax(a, b); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#define __expf(x) expf(x)  // glibc declares functions of these names: the fast intrinsics are macros here
#define __logf(x) logf(x)
#define __powf(x, y) powf(x, y)
#define __fdividef(x, y) ((x) / (y))

// The runtime API, exported for tensorgen.runtime.cuda; "device" memory is host memory.
extern "C" {
int tensorgen_cuda_emulation(void) { return 1; }
cudaError_t cudaGetDeviceCount(int* count) { *count = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : tg_emu::fail(cudaErrorInvalidValue, "invalid device ordinal %d", device);
}
cudaError_t cudaMalloc(void** ptr, size_t size) {
  *ptr = aligned_alloc(256, (size + 255) / 256 * 256 + 256 * (size == 0));
  return *ptr ? cudaSuccess : tg_emu::fail(cudaErrorMemoryAllocation, "out of memory allocating %zu bytes", size);
}
cudaError_t cudaFree(void* ptr) { free(ptr); return cudaSuccess; }
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind) {
  memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t count) { memset(dst, value, count); return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return tg_emu::emu.error; }
cudaError_t cudaPeekAtLastError(void) { return tg_emu::emu.error; }
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = tg_emu::emu.error;
  tg_emu::emu.error = cudaSuccess;
  return e;
}
const char* cudaGetErrorString(cudaError_t error) {
  if (error != cudaSuccess && error == tg_emu::emu.described) return tg_emu::emu.message;
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unrecognized error code";
}
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st{0.0};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) { delete event; return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t = nullptr) {
  event->seconds = tg_emu::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = (float)(1e3 * (end->seconds - start->seconds));
  return cudaSuccess;
}
}
template <class T> static inline cudaError_t cudaMalloc(T** ptr, size_t size) { return cudaMalloc((void**)ptr, size); }
"""

#: Part of the cache key of every emulated library, and the name of the header file in the kernel cache.
HEADER_DIGEST = hashlib.sha256(HEADER.encode()).hexdigest()[:16]
