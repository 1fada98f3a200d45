"""tensorgen: generate high-performance tensor programs by search (Ansor, AutoTVM, ALT, Pruner).

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
    "State", "TensorExprError", "TensorgenError", "TuneResult", "__version__", "build", "tune",
]
