"""tensorgen: generate high-performance tensor programs by search (Ansor, AutoTVM, ALT, Pruner).

The compiler core: tensor expressions (`tensorgen.te`), ComputeDAG, schedule States made of
replayable Steps, lowering to loop IR, C code generation and a ctypes runtime.
"""

__version__ = "0.1.0"

from tensorgen.build import CompiledFunction, build  # noqa: E402
from tensorgen.dag import ComputeDAG  # noqa: E402
from tensorgen.errors import (  # noqa: E402
    CompileError,
    LoweringError,
    RuntimeCallError,
    ScheduleError,
    TensorExprError,
    TensorgenError,
)
from tensorgen.schedule import State  # noqa: E402
from tensorgen.tune import TuneResult, tune  # noqa: E402

__all__ = [
    "CompileError", "CompiledFunction", "ComputeDAG", "LoweringError", "RuntimeCallError", "ScheduleError",
    "State", "TensorExprError", "TensorgenError", "TuneResult", "__version__", "build", "tune",
]
