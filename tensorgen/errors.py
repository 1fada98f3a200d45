"""The errors tensorgen raises on bad input; each names what was wrong and where."""


class TensorgenError(Exception):
    """Base of every error tensorgen raises on purpose."""


class TensorExprError(TensorgenError, ValueError):
    """A tensor expression is ill-formed (wrong arity, bad index, misplaced reduction, ...)."""


class ScheduleError(TensorgenError, ValueError):
    """A schedule step cannot be applied to the state it was given, or steps that each applied make no program
    together (a stage read where it is not computed: a step cannot tell, since a later compute_at may fix it)."""


class LoweringError(TensorgenError):
    """A valid-looking state could not be lowered to a loop nest."""


class CompileError(TensorgenError):
    """The C compiler rejected generated code; `source` carries the offending program."""

    def __init__(self, message: str, source: str = "", log: str = ""):
        super().__init__(message)
        self.source = source
        self.log = log

    def first_error(self) -> str:
        """The compiler's first error line (the message's first line if none says "error")."""
        lines = str(self).splitlines() or [""]
        return next((line.strip() for line in lines if "error" in line), lines[0])


class ToolchainError(CompileError):
    """The C toolchain or the kernel cache cannot work at all (no compiler, flags it rejects, an unwritable
    cache): no program can be built until the environment is fixed, so this stops a run instead of being
    stored as a failure of the program at hand."""


class MemoryBudgetError(TensorgenError):
    """A model or task needs more memory than the budget allows (see hardware.memory_limit); refused before
    anything of its size is allocated."""


class RuntimeCallError(TensorgenError, ValueError):
    """A compiled kernel was called with arrays of the wrong shape, dtype or layout."""


class DeviceError(TensorgenError, RuntimeError):
    """No CUDA GPU (or driver, or runtime library) is usable, or a CUDA call failed: one line naming the call
    and CUDA's own words for the error."""


class ClusterError(TensorgenError):
    """A Ray cluster cannot measure: ray is not installed, its address does not answer, or no node of it
    advertises the target at hand."""


class TuneError(TensorgenError, ValueError):
    """Tuning was asked for something it cannot do (an unknown policy or cost model, a negative budget, ...)."""
