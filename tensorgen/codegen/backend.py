"""Backends: how lowered programs of one kind of target become source text and then a loadable library.

A backend renders one kernel (`render`: a standalone library, as tuning measures it) or a whole model's kernels
with the executor that calls them (`render_module`), and compiles source with its toolchain. The C backend is the
CPU's; a CUDA backend implements the same protocol and registers itself under its target kind in BACKENDS.
Every site that compiles a program goes through `backend_for(target, hw)` and tensorgen.build.compile_state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tensorgen.codegen.c import render_c, render_module
from tensorgen.codegen.cuda import render_cuda, render_cuda_module
from tensorgen.codegen.cuda_toolchain import (
    compile_cuda,
    compile_emulated,
    cuda_preflight,
    emulation_preflight,
)
from tensorgen.codegen.toolchain import compile_source, preflight
from tensorgen.gpus import DEFAULT_ARCH
from tensorgen.loopir.nodes import PrimFunc
from tensorgen.registry import Registry
from tensorgen.target import HardwareParams, Target


class Backend(Protocol):
    """Source text and a compiled library for one target. `binds_threads`: its programs may bind loops to GPU
    blocks and threads (lowering refuses such bindings otherwise)."""

    binds_threads: bool

    def render(self, func: PrimFunc) -> str:
        """The source of a library holding `func` alone (and the thread-control entry points)."""
        ...

    def render_module(self, funcs: Sequence[PrimFunc], tail: str = "") -> str:
        """The source of a model's library: every function of `funcs` once, sharing one scratch area, then `tail`
        (the executor)."""
        ...

    def compile(self, source: str, timeout: float | None = None) -> Path:
        """The path of the shared library built from `source` (cached by content)."""
        ...

    def preflight(self, again: bool = False) -> None:
        """Raise ToolchainError naming what is broken if this machine cannot build and load a trivial kernel
        (checked once per process unless `again`)."""
        ...


@dataclass(frozen=True)
class CBackend:
    """C with OpenMP and explicit SIMD (GCC vector extensions of `simd_bytes`), built by gcc or clang with
    `-march=march` (`cc`: the compiler command, default $CC, else gcc, else clang)."""

    simd_bytes: int = 32
    march: str | None = "native"
    cc: str | None = None
    binds_threads: bool = field(default=False, init=False)

    def render(self, func: PrimFunc) -> str:
        return render_c(func, self.simd_bytes)

    def render_module(self, funcs: Sequence[PrimFunc], tail: str = "") -> str:
        return render_module(list(funcs), self.simd_bytes, tail, scratch=True)

    def compile(self, source: str, timeout: float | None = None) -> Path:
        return compile_source(source, cc=self.cc, march=self.march, timeout=timeout)

    def preflight(self, again: bool = False) -> None:
        preflight(self.cc, self.march, again=again)


@dataclass(frozen=True)
class CudaBackend:
    """CUDA C (codegen.cuda) built by nvcc for GPUs of `arch`; with `emulate`, built by the C++ compiler against
    the CPU emulation of codegen.cuda_emu instead (a machine without a GPU: tests, checking programs). Blocks of
    at most `max_threads` threads and `shared_bytes` of shared memory."""

    arch: str = DEFAULT_ARCH
    emulate: bool = False
    max_threads: int = 1024
    shared_bytes: int = 48 * 1024
    binds_threads: bool = field(default=True, init=False)

    def render(self, func: PrimFunc) -> str:
        return render_cuda(func, self.max_threads, self.shared_bytes)

    def render_module(self, funcs: Sequence[PrimFunc], tail: str = "") -> str:
        return render_cuda_module(funcs, self.max_threads, self.shared_bytes, tail)

    def compile(self, source: str, timeout: float | None = None) -> Path:
        if self.emulate:
            return compile_emulated(source, timeout)
        return compile_cuda(source, self.arch, timeout)

    def preflight(self, again: bool = False) -> None:
        if self.emulate:
            emulation_preflight(again=again)
        else:
            cuda_preflight(self.arch, again=again)


def _c_backend(target: Target, hw: HardwareParams) -> Backend:
    return CBackend(hw.simd_bytes, target.march)


def _cuda_backend(target: Target, hw: HardwareParams) -> Backend:
    return CudaBackend(hw.extra.get("arch", DEFAULT_ARCH), target.emulated, hw.max_threads_per_block,
                       hw.shared_mem_per_block)


#: Target kind -> backend_factory(target, hw).
BACKENDS: Registry[Backend] = Registry("backend")
BACKENDS.register("cpu", _c_backend)
BACKENDS.register("cuda", _cuda_backend)


def backend_for(target: Target, hw: HardwareParams) -> Backend:
    """The backend of `target`'s kind, configured from its resolved hardware parameters."""
    return BACKENDS.create(target.kind, target, hw)
