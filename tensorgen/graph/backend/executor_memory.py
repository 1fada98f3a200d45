"""Where a compiled model's executor keeps its tensors: the host's memory (a CPU model: `HOST`) or a GPU's (a
CUDA model: `DEVICE`). The executor (executor.py) writes the same entry points, memory plan, kernel calls and
index checks for both; a memory says how its tensors are allocated, reached and copied.

A host model reads its inputs and writes its outputs where the caller holds them. A device model copies each
input to a slot of its arena before the first kernel and each output back after the last one; its weights are
copied to the device once, by init; every CUDA call's error ends the run (nonzero, CUDA's words in
tensorgen_model_error); the run-time indices of a Gather or Scatter are checked on the host, copied back from the
device first where a kernel computed them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

ALIGN = 64


class Memory(Protocol):
    """How an executor reaches its tensors."""

    #: graph inputs and outputs are read and written in the caller's arrays (else copied through arena slots)
    in_place: bool
    #: the kernels read the weights where the caller of init holds them (the loader's read-only mapping of
    #: weights.bin), else init copies them
    maps_weights: bool

    def input(self, i: int) -> str:
        """The pointer expression of graph input i where kernels read it ("": an arena slot)."""
        ...

    def output(self, i: int) -> str:
        """The pointer expression of graph output i where kernels write it ("": an arena slot)."""
        ...

    def copy_in(self, var: str, i: int, nbytes: int) -> list[str]:
        """Lines that put graph input i where `var` points."""
        ...

    def copy_out(self, i: int, src: str, nbytes: int) -> str:
        """The line that puts the value at `src` into graph output i."""
        ...

    def fetch(self, src: str, nbytes: int, what: str) -> list[str]:
        """Lines that copy `nbytes` at `src` (`what`, for an error) to the host buffer m->staging; only asked of a
        memory not in place."""
        ...

    def call(self, kernel: str, args: str) -> str:
        """The statement calling a kernel."""
        ...

    def runtime(self, weight_bytes: int, arena_bytes: int, staging_bytes: int) -> str:
        """The model's struct, tensorgen_model_init and _free, and TENSORGEN_SYNC(k) (what a profile waits for
        after kernel k)."""
        ...

    def wrap(self, text: str) -> str:
        """The executor's source as the module compiles it."""
        ...


@dataclass(frozen=True)
class HostMemory:
    """Tensors in host memory; the kernels run on the module's thread pool (codegen.pool)."""

    in_place: bool = True
    maps_weights: bool = True

    def input(self, i: int) -> str:
        return f"inputs[{i}]"

    def output(self, i: int) -> str:
        return f"outputs[{i}]"

    def copy_in(self, var: str, i: int, nbytes: int) -> list[str]:
        return []

    def copy_out(self, i: int, src: str, nbytes: int) -> str:
        return f"  memcpy(outputs[{i}], {src}, {nbytes});"

    def fetch(self, src: str, nbytes: int, what: str) -> list[str]:
        raise AssertionError("host memory is read in place")

    def call(self, kernel: str, args: str) -> str:
        return f"{kernel}({args})"

    def runtime(self, weight_bytes: int, arena_bytes: int, staging_bytes: int) -> str:
        return f"""#include <stdio.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

typedef struct {{ char* arena; const char* weights; char* scratch; char error[256]; }} tensorgen_model;

/* activations on huge pages where the kernel allows them (THP "madvise") */
static void* tensorgen_big_alloc(size_t bytes) {{
  size_t huge = (size_t)1 << 21, size = (bytes + huge - 1) / huge * huge;
  void* p = aligned_alloc(huge, size);
#ifdef MADV_HUGEPAGE
  if (p) madvise(p, size, MADV_HUGEPAGE);
#endif
  return p;
}}

tensorgen_model* tensorgen_model_init(const void* weights) {{
  tensorgen_model* m = (tensorgen_model*)malloc(sizeof(tensorgen_model));
  if (!m) return NULL;
  m->arena = (char*)tensorgen_big_alloc({max(arena_bytes, 1)});
  m->weights = (const char*)weights;  /* {weight_bytes} bytes, read in place: the caller keeps them until _free */
  m->scratch = (char*)aligned_alloc({ALIGN}, TENSORGEN_SCRATCH_BYTES + {ALIGN});
  if (!m->arena || !m->scratch) {{
    free(m->arena); free(m->scratch); free(m); return NULL;
  }}
  m->error[0] = 0;
  return m;
}}

void tensorgen_model_free(tensorgen_model* m) {{
  if (m) {{ free(m->arena); free(m->scratch); free(m); }}
}}

#define TENSORGEN_SYNC(k) ((void)0)
"""

    def wrap(self, text: str) -> str:
        return text


@dataclass(frozen=True)
class DeviceMemory:
    """Tensors in a GPU's memory (CUDA; host memory under the emulation of codegen.cuda_emu); the kernels are
    host entry points of codegen.cuda that return a CUDA error."""

    in_place: bool = False
    maps_weights: bool = False

    def input(self, i: int) -> str:
        return ""

    def output(self, i: int) -> str:
        return ""

    def copy_in(self, var: str, i: int, nbytes: int) -> list[str]:
        return [f'  TENSORGEN_CUDA(cudaMemcpy({var}, inputs[{i}], {nbytes}, cudaMemcpyHostToDevice), '
                f'"copying input {i} to the device");']

    def copy_out(self, i: int, src: str, nbytes: int) -> str:
        return (f'  TENSORGEN_CUDA(cudaMemcpy(outputs[{i}], {src}, {nbytes}, cudaMemcpyDeviceToHost), '
                f'"copying output {i} from the device");')

    def fetch(self, src: str, nbytes: int, what: str) -> list[str]:
        return [f'  TENSORGEN_CUDA(cudaMemcpy(m->staging, {src}, {nbytes}, cudaMemcpyDeviceToHost), "copying {what} '
                'to the host");']

    def call(self, kernel: str, args: str) -> str:
        return f"TENSORGEN_CUDA({kernel}({args}), \"kernel {kernel}\")"

    def runtime(self, weight_bytes: int, arena_bytes: int, staging_bytes: int) -> str:
        return f"""#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {{ char* arena; char* weights; char* scratch; char* staging; char error[256]; }} tensorgen_model;

static void tensorgen_release(tensorgen_model* m) {{
  cudaFree(m->arena); cudaFree(m->weights); cudaFree(m->scratch); free(m->staging); free(m);
}}

/* the arena (intermediates, then a slot per input and output), the weights and the kernels' scratch on the device;
   NULL where an allocation or the weights' copy fails */
tensorgen_model* tensorgen_model_init(const void* weights) {{
  tensorgen_model* m = (tensorgen_model*)calloc(1, sizeof(tensorgen_model));
  if (!m) return NULL;
  if (cudaMalloc((void**)&m->arena, {max(arena_bytes, 1)}) != cudaSuccess ||
      cudaMalloc((void**)&m->weights, {max(weight_bytes, 1)}) != cudaSuccess ||
      cudaMalloc((void**)&m->scratch, TENSORGEN_SCRATCH_BYTES + {ALIGN}) != cudaSuccess ||
      cudaMemcpy(m->weights, weights, {weight_bytes}, cudaMemcpyHostToDevice) != cudaSuccess ||
      !(m->staging = (char*)malloc({max(staging_bytes, 1)}))) {{
    tensorgen_release(m);
    return NULL;
  }}
  return m;
}}

void tensorgen_model_free(tensorgen_model* m) {{
  if (m) tensorgen_release(m);
}}

/* the kernels run on the GPU: no host threads to set */
void tensorgen_set_num_threads(int n) {{ (void)n; }}

/* a CUDA call that fails ends the run, naming what failed and CUDA's reason */
#define TENSORGEN_CUDA(call, what) do {{ cudaError_t e_ = (cudaError_t)(call); if (e_ != cudaSuccess) {{ \\
    snprintf(m->error, sizeof(m->error), "%s: CUDA error %d (%s)", what, (int)e_, cudaGetErrorString(e_)); \\
    return 1; }} }} while (0)
/* a profile waits for kernel k before reading the clock */
#define TENSORGEN_SYNC(k) TENSORGEN_CUDA(cudaDeviceSynchronize(), "a kernel")
"""

    def wrap(self, text: str) -> str:
        return f'extern "C" {{\n{text}}}\n'  # the C ABI from a C++ (CUDA) module


HOST = HostMemory()
DEVICE = DeviceMemory()
