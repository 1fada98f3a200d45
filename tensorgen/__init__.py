"""tensorgen: generate high-performance tensor programs by search (Ansor, AutoTVM, ALT, Pruner) for CPUs and GPUs.

The compiler core: tensor expressions (`tensorgen.te`), ComputeDAG, schedule States made of
replayable Steps, lowering to loop IR, C code generation and a ctypes runtime.
"""

from tensorgen.build import CompiledFunction, build
from tensorgen.dag import ComputeDAG
from tensorgen.errors import (
    CompileError,
    LoweringError,
    RuntimeCallError,
    ScheduleError,
    TensorExprError,
    TensorgenError,
)
from tensorgen.schedule import State
from tensorgen.tuning.tune import TuneResult, tune
from tensorgen.version import __version__

__all__ = [
    "CompileError", "CompiledFunction", "ComputeDAG", "LoweringError", "RuntimeCallError", "ScheduleError",
    "State", "TensorExprError", "TensorgenError", "TuneResult", "__version__", "build", "from_torch", "tune",
]


def from_torch(module, example_inputs, name=None):  # torch stays an optional import
    """The graph IR (tensorgen.graph.ir.Graph) of a torch.nn.Module called on `example_inputs`, converted from its
    torch.export graph (Core ATen) with parameters and buffers as constants; tune, build and run it like an ONNX
    model (tensorgen.graph.backend.tasks.extract_tasks, tensorgen.graph.backend.build.build_model)."""
    from tensorgen.graph.frontend.torch_import import import_torch

    return import_torch(module, example_inputs, name)
