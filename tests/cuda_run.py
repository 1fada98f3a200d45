"""One call from CUDA source to NumPy results: build (emulated, or by nvcc), copy arrays to the device, call a host
entry point, copy every array back in place. On a machine without a GPU only `emulate=True` runs."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import numpy as np

from tensorgen.codegen.cuda_toolchain import compile_cuda, compile_emulated
from tensorgen.runtime.cuda import CudaLibrary

PRELUDE = """#ifndef TENSORGEN_CUDA_EMULATION
#include <cuda_runtime.h>
#define TG_LAUNCH(kernel, grid, block, ...) kernel<<<(grid), (block)>>>(__VA_ARGS__)
#endif
#include <math.h>
#include <stdint.h>
"""


def library(source: str | Path, emulate: bool = True) -> CudaLibrary:
    """The loaded library of `source` (CUDA text, built and cached; a Path: a library built before)."""
    if isinstance(source, Path):
        return CudaLibrary(source)
    return CudaLibrary(compile_emulated(source) if emulate else compile_cuda(source))


def run(source: str | Path, entry: str, *arrays: np.ndarray, emulate: bool = True) -> None:
    """Call host entry point `entry` of `source` on device copies of `arrays`, then copy each back into its array
    (outputs are written in place). DeviceError if the entry point reports a CUDA error."""
    lib = library(source, emulate)
    with ExitStack() as stack:
        device = [stack.enter_context(lib.runtime.to_device(a)) for a in arrays]
        lib.entry(entry)(*device)
        for host, dev in zip(arrays, device):
            host[...] = dev.to_numpy()
