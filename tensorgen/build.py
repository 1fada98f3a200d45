"""The compile pipeline: from a State (or a DAG, for the naive program) to a compiled library (`compile_state`,
which every site that compiles a program uses) and to a callable function (`build`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorgen.codegen.backend import Backend, CBackend, backend_for
from tensorgen.dag import ComputeDAG
from tensorgen.errors import RuntimeCallError
from tensorgen.loopir.nodes import PrimFunc
from tensorgen.runtime import ArgSpec, Kernel, Module, aligned, aligned_empty
from tensorgen.runtime.cuda import CudaLibrary, HostEntry
from tensorgen.schedule.gpu_bind import bind_unbound
from tensorgen.schedule.lower import lower
from tensorgen.schedule.state import State
from tensorgen.target import Target
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


@dataclass
class CudaFunction:
    """A compiled CUDA program: call it with NumPy arrays (inputs then outputs) and it copies them to the GPU (to
    its emulation's memory on a CPU), runs, and copies the outputs back into their arrays; or use `run`."""

    dag: ComputeDAG
    source: str
    library: CudaLibrary
    entry: HostEntry

    def __call__(self, *arrays: np.ndarray) -> None:
        args = self.dag.args
        if len(arrays) != len(args):
            raise RuntimeCallError(f"{self.entry.name} takes {len(args)} arrays "
                                   f"({', '.join(t.name for t in args)}), got {len(arrays)}")
        outputs = len(args) - len(self.dag.outputs)
        with ExitStack() as stack:
            device = []
            for t, a in zip(args, arrays):
                if not isinstance(a, np.ndarray) or a.shape != t.shape or a.dtype != np.dtype(t.dtype):
                    got = f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
                    raise RuntimeCallError(f"{self.entry.name}: {t.name} must be a {t.dtype}{list(t.shape)} "
                                           f"array, got {got}")
                device.append(stack.enter_context(self.library.runtime.to_device(a)))
            self.entry(*device)
            for host, dev in zip(arrays[outputs:], device[outputs:]):
                host[...] = dev.to_numpy()

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Allocate outputs, call, and return them."""
        outs = [np.empty(t.shape, t.dtype) for t in self.dag.outputs]
        self(*inputs, *outs)
        return outs


def build(
    program: State | ComputeDAG | Tensor | Sequence[Tensor],
    *,
    simd_bytes: int | None = None,
    march: str | None = "native",
    cc: str | None = None,
    name: str | None = None,
    target: str | Target = "cpu",
) -> CompiledFunction | CudaFunction:
    """Compile `program` for `target`: this machine's CPU by default, where `simd_bytes` (vector width of
    `vectorize` loops) defaults to the host's widest (64 with AVX-512), as the tuner's measurements use; or a CUDA
    target (`cuda -arch=sm_90`, `cuda -emulate=1` to run on this CPU), where root stages without a GPU binding
    are spread over blocks of threads (schedule.gpu_bind)."""
    target = Target.parse(target)
    if target.kind == "cuda":
        from tensorgen.hardware import hardware_for

        state = bind_unbound(program if isinstance(program, State) else State(program))
        built = compile_state(state, backend_for(target, hardware_for(target)), name)
        library = CudaLibrary(built.path)
        return CudaFunction(state.dag, built.source, library, library.entry(built.func.name))
    if simd_bytes is None:
        from tensorgen.hardware import detect_cpu

        simd_bytes = detect_cpu().simd_bytes
    state = program if isinstance(program, State) else State(program)
    built = compile_state(state, CBackend(simd_bytes, march, cc), name)
    module = Module(built.path)
    args = [ArgSpec(b.name, b.shape, b.dtype) for b in built.func.args]
    return CompiledFunction(state.dag, built.source, module, module.kernel(built.func.name, args))
