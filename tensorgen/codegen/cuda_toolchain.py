"""Build generated CUDA into shared libraries, cached by content like C kernels (toolchain.build_cached): with nvcc
for a GPU (`compile_cuda`), or as C++ against the emulation header for this CPU (`compile_emulated`).

Both libraries export the source's host entry points, which take device pointers. An nvcc-built library links the
CUDA runtime dynamically (`--cudart=shared`, with an rpath to the toolkit's copy), so the runtime that the Python
side binds (through the library itself, tensorgen.runtime.cuda) is the one its kernels launch on.
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from ..errors import ToolchainError
from .cuda_emu import HEADER, HEADER_DIGEST
from .toolchain import (
    BuildCommand,
    atomic_write,
    build_cached,
    build_probe,
    cache_dir,
    find_command,
    tool_version,
    usable_cache_dir,
)

#: The GPU generation kernels are built for by default (H100/H200).
DEFAULT_ARCH = "sm_90"
NVCC_FLAGS: tuple[str, ...] = ("-O3", "-shared", "-Xcompiler", "-fPIC", "--cudart=shared")
#: -Bsymbolic: the library's own runtime functions win over a real libcudart loaded into the process first.
EMULATION_FLAGS: tuple[str, ...] = ("-x", "c++", "-std=c++17", "-O1", "-shared", "-fPIC", "-Wl,-Bsymbolic",
                                    "-DTENSORGEN_CUDA_EMULATION")


def find_nvcc(nvcc: str | None = None) -> list[str]:
    """The nvcc command: `nvcc`, else $NVCC, else nvcc on PATH, else the one under $CUDA_HOME, $CUDA_PATH or
    /usr/local/cuda."""
    homes = [os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)] + ["/usr/local/cuda"]
    return find_command(nvcc, "NVCC", ["nvcc", *(str(Path(h) / "bin" / "nvcc") for h in homes)], "CUDA compiler")


def find_cxx(cxx: str | None = None) -> list[str]:
    """The C++ compiler emulated CUDA is built with: `cxx`, else $CXX, else g++, else clang++."""
    return find_command(cxx, "CXX", ("g++", "clang++"), "C++ compiler")


@cache
def cudart_dir(nvcc: str) -> Path | None:
    """The directory of the libcudart.so that `nvcc` links against (from its dry run), None if it names none."""
    try:
        out = subprocess.run([nvcc, "--dryrun", "--cudart=shared", "-shared", "-o", "probe.so", "probe.cu"],
                             check=False, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"cannot run the CUDA compiler {nvcc!r}: {exc}") from None
    dirs = [Path(d) for line in (out.stderr + out.stdout).splitlines() if line.startswith("#$ LIBRARIES=")
            for d in re.findall(r'-L"?([^"\s]+)', line)]
    return next((d.resolve() for d in dirs if any(d.glob("libcudart.so*"))), None)


def nvcc_command(arch: str = DEFAULT_ARCH, nvcc: str | None = None) -> BuildCommand:
    """How nvcc builds a library of host entry points and kernels for GPUs of `arch` (e.g. sm_90)."""
    cmd = find_nvcc(nvcc)
    lib = cudart_dir(cmd[0])
    rpath = ("-Xlinker", f"-rpath,{lib}") if lib else ()
    return BuildCommand(tuple(cmd), (*NVCC_FLAGS, f"-arch={arch}", *rpath), tool_version(cmd[0]),
                        suffix=".cu", what="CUDA compiler")


def emulation_header() -> Path:
    """The emulation header, written into the kernel cache under a name carrying its digest (so the flags that
    include it, part of every emulated library's cache key, change with its content)."""
    path = usable_cache_dir() / f"cuda_emu-{HEADER_DIGEST}.h"
    try:
        if not (path.is_file() and path.read_text() == HEADER):
            atomic_write(path, HEADER)
    except OSError as exc:
        raise ToolchainError(f"cannot write the CUDA emulation header {path}: {exc}") from None
    return path


def emulation_command(cxx: str | None = None) -> BuildCommand:
    """How the C++ compiler builds CUDA source into a library that runs its kernels on the CPU."""
    cmd = find_cxx(cxx)
    return BuildCommand(tuple(cmd), (*EMULATION_FLAGS, "-include", str(emulation_header())),
                        tool_version(cmd[0]), suffix=".cu", what="C++ compiler (CUDA emulation)")


def compile_cuda(source: str, arch: str = DEFAULT_ARCH, timeout: float | None = None) -> Path:
    """Compile CUDA `source` with nvcc for `arch` into a shared library (cached by content) and return its path."""
    return build_cached(source, nvcc_command(arch), timeout)


def compile_emulated(source: str, timeout: float | None = None, cxx: str | None = None) -> Path:
    """Compile CUDA `source` for the CPU emulation (see cuda_emu) into a shared library (cached by content)."""
    return build_cached(source, emulation_command(cxx), timeout)


_PREFLIGHT_CU = r"""
#ifndef TENSORGEN_CUDA_EMULATION
#include <cuda_runtime.h>
#define TG_LAUNCH(kernel, grid, block, ...) kernel<<<(grid), (block)>>>(__VA_ARGS__)
#endif
extern "C" __global__ void __launch_bounds__(64) tensorgen_reverse(int* out) {
  __shared__ int tile[64];
  tile[threadIdx.x] = blockIdx.x * 64 + threadIdx.x;
  __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = tile[63 - threadIdx.x];
}
extern "C" int tensorgen_preflight(int* out) {
  TG_LAUNCH(tensorgen_reverse, dim3(2, 1, 1), dim3(64, 1, 1), out);
  return (int)cudaGetLastError();
}
"""
_passed: set[tuple[str, ...]] = set()


def cuda_preflight(arch: str = DEFAULT_ARCH, *, again: bool = False) -> None:
    """Check once per process, arch and cache directory (`again`: check anew) that nvcc builds a trivial kernel
    for `arch` with the flags every kernel gets and that the library loads (its CUDA runtime is found). It does
    not run the kernel: whether a GPU is present is the runtime's question (tensorgen.runtime.cuda)."""
    command = nvcc_command(arch)
    key = ("nvcc", *command.compiler, *command.flags, str(cache_dir()))
    if key in _passed and not again:
        return
    with tempfile.TemporaryDirectory(dir=usable_cache_dir(), prefix="preflight.") as tmp:
        build_probe(command, _PREFLIGHT_CU, Path(tmp), f"check $NVCC, $CUDA_HOME and that nvcc knows {arch}")
    _passed.add(key)


def emulation_preflight(cxx: str | None = None, *, again: bool = False) -> None:
    """Check once per process, compiler and cache directory (`again`: check anew) that the C++ compiler builds a
    trivial kernel (two blocks, shared memory, a barrier) against the emulation header, and that it runs right."""
    command = emulation_command(cxx)
    key = ("emulation", *command.compiler, *command.flags, str(cache_dir()))
    if key in _passed and not again:
        return
    with tempfile.TemporaryDirectory(dir=usable_cache_dir(), prefix="preflight.") as tmp:
        entry = build_probe(command, _PREFLIGHT_CU, Path(tmp), "check $CXX (a C++17 compiler with ucontext)")
        out = (ctypes.c_int * 128)()
        code = entry(out)
    expected = [b * 64 + 63 - t for b in range(2) for t in range(64)]
    if code != 0 or list(out) != expected:
        raise ToolchainError(f"a trivial kernel emulated by {shlex.join(command.compiler)} returns error {code} and "
                             f"{list(out)[:4]}... instead of {expected[:4]}...")
    _passed.add(key)
