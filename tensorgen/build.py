"""The compile pipeline: from a State (or a DAG, for the naive program) to a compiled library (`compile_state`,
which every site that compiles a program uses) and to a callable function (`build`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorgen.codegen.backend import Backend, CBackend
from tensorgen.dag import ComputeDAG
from tensorgen.loopir.nodes import PrimFunc
from tensorgen.runtime import ArgSpec, Kernel, Module, aligned, aligned_empty
from tensorgen.schedule.lower import lower
from tensorgen.schedule.state import State
from tensorgen.te.tensor import Tensor


@dataclass(frozen=True)
class Compiled:
    """A program lowered, rendered and compiled: its loop IR, its source and the library built from it."""

    func: PrimFunc
    source: str
    path: Path


def compile_state(state: State, backend: Backend, name: str | None = None, *, tail: str = "",
                  edit: Callable[[str], str] | None = None, deadline: float | None = None) -> Compiled:
    """Lower `state` (its function named `name`), render it with `backend` followed by `tail` (more source, e.g.
    the measurement harness's entry points), let `edit` rewrite the text (tests inject faults so), and compile
    it, with what is left until `deadline` (a time.perf_counter() value; at least 0.1 s) as the compile's limit."""
    func = lower(state, name, gpu=backend.binds_threads)
    source = backend.render(func) + tail
    if edit is not None:
        source = edit(source)
    timeout = max(0.1, deadline - time.perf_counter()) if deadline is not None else None
    return Compiled(func, source, backend.compile(source, timeout))


@dataclass
class CompiledFunction:
    """A compiled program: call it with inputs then outputs (NumPy arrays), or use `run`."""

    dag: ComputeDAG
    source: str
    module: Module
    kernel: Kernel

    def __call__(self, *arrays: np.ndarray) -> None:
        self.kernel(*arrays)

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Allocate outputs, call, and return them (inputs that are not 64-byte aligned are copied first,
        see runtime.module.ALIGNMENT)."""
        outs = [aligned_empty(t.shape, t.dtype) for t in self.dag.outputs]
        self.kernel(*[aligned(x) if isinstance(x, np.ndarray) and x.flags.c_contiguous else x for x in inputs], *outs)
        return outs

    def set_num_threads(self, n: int) -> None:
        self.module.set_num_threads(n)


def build(
    program: State | ComputeDAG | Tensor | Sequence[Tensor],
    *,
    simd_bytes: int | None = None,
    march: str | None = "native",
    cc: str | None = None,
    name: str | None = None,
) -> CompiledFunction:
    """Compile `program` for this machine; `simd_bytes` (vector width of `vectorize` loops) defaults
    to the host's widest (64 with AVX-512), as the tuner's measurements use."""
    if simd_bytes is None:
        from tensorgen.hardware import detect_cpu

        simd_bytes = detect_cpu().simd_bytes
    state = program if isinstance(program, State) else State(program)
    built = compile_state(state, CBackend(simd_bytes, march, cc), name)
    module = Module(built.path)
    args = [ArgSpec(b.name, b.shape, b.dtype) for b in built.func.args]
    return CompiledFunction(state.dag, built.source, module, module.kernel(built.func.name, args))
