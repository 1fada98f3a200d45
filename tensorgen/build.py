"""From a State (or a DAG, for the naive program) to a callable compiled function."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.codegen.c import render_c
from tensorgen.codegen.toolchain import compile_source
from tensorgen.dag import ComputeDAG
from tensorgen.runtime import ArgSpec, Kernel, Module, aligned, aligned_empty
from tensorgen.schedule.lower import lower
from tensorgen.schedule.state import State
from tensorgen.te.tensor import Tensor


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
    func = lower(state, name)
    source = render_c(func, simd_bytes)
    module = Module(compile_source(source, cc=cc, march=march))
    args = [ArgSpec(b.name, b.shape, b.dtype) for b in func.args]
    return CompiledFunction(state.dag, source, module, module.kernel(func.name, args))
