"""What goes into and comes out of measurement: every failure has a kind and a message."""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tensorgen.schedule.layout_rewrite import LayoutRewrite
from tensorgen.schedule.state import State
from tensorgen.task import SearchTask


class ErrorKind(str, enum.Enum):
    NONE = "none"
    INSTANTIATION = "instantiation"  # the state is not a valid program (schedule/lowering error)
    COMPILE_ERROR = "compile_error"
    COMPILE_TIMEOUT = "compile_timeout"
    RUNTIME_ERROR = "runtime_error"  # crash or signal in the candidate
    RUN_TIMEOUT = "run_timeout"
    WRONG_ANSWER = "wrong_answer"
    UNKNOWN = "unknown"  # the harness or the build machinery failed, not the candidate
    # timed while the machine was busy (a calibration kernel timed around it ran slower than quiet): the costs
    # are kept in the record but are not the program's, which is measured again once the machine is quiet
    BUSY = "busy"

    @property
    def retryable(self) -> bool:
        """Whether the error may describe the machine rather than the program (a timeout under another
        process's load, a failed harness or build worker): such a program is measured again on resume."""
        return self in (ErrorKind.COMPILE_TIMEOUT, ErrorKind.RUN_TIMEOUT, ErrorKind.UNKNOWN, ErrorKind.BUSY)


@dataclass(frozen=True)
class MeasureInput:
    task: SearchTask
    state: State


@dataclass(frozen=True)
class BuildResult:
    """A compiled candidate: the shared object and the C source, or why there is none. `layouts` are
    the constants the build repacked (the runner hands it their data repacked)."""

    path: str | None
    source: str
    error_kind: ErrorKind = ErrorKind.NONE
    error_msg: str = ""
    build_seconds: float = 0.0
    layouts: tuple[LayoutRewrite, ...] = ()


@dataclass(frozen=True)
class MeasureResult:
    """`costs` are seconds per run, one per repeat; `all_cost` is build + run wall time."""

    costs: tuple[float, ...]
    error_kind: ErrorKind = ErrorKind.NONE
    error_msg: str = ""
    all_cost: float = 0.0
    timestamp: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.error_kind == ErrorKind.NONE

    @property
    def mean_cost(self) -> float:
        return sum(self.costs) / len(self.costs) if self.ok and self.costs else float("inf")

    @property
    def median_cost(self) -> float:
        if not self.ok or not self.costs:
            return float("inf")
        c = sorted(self.costs)
        return c[len(c) // 2] if len(c) % 2 else (c[len(c) // 2 - 1] + c[len(c) // 2]) / 2


#: How often a program whose every measurement failed with a retryable error is measured before its
#: failure is taken as its own (a program that always times out must not be re-run on every resume).
MEASURE_ATTEMPTS = 3


def measure_again(results: Sequence[MeasureResult]) -> bool:
    """Whether a program measured with `results` (all its records so far) is to be measured again."""
    return len(results) < MEASURE_ATTEMPTS and all(ErrorKind(r.error_kind).retryable for r in results)
