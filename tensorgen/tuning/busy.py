"""Tuning that notices a busy machine: the runner's calibration kernel (measure.calibration) is timed before each
measured batch, every INTERVAL_S seconds within it and after it. The results of a stretch between two timings of
which one ran more than `bound` times slower than quiet are committed marked (ErrorKind.BUSY: the costs are kept in
the record, but they are no program's time, so none of them becomes a task's best) and measured again once the
machine is quiet: in a later batch of the same run, or by the next run on the database.

A measurement is held until the timing after it (at most INTERVAL_S, or the rest of its batch), so that a load that
starts after a timing still marks it; an interrupted batch commits what it holds, marked by the last timing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from tensorgen.measure.calibration import BOUND_ENV
from tensorgen.measure.runner import Runner
from tensorgen.measure.types import ErrorKind, MeasureResult
from tensorgen.task import SearchTask

#: seconds of measuring between two timings of the calibration kernel within a batch: a timing is one harness run
#: (its 20 ms warm-up, the process): 100-150 ms on a loaded 2-core machine, where 2 s between them took 8% of the
#: batches' time
INTERVAL_S = 4.0


@dataclass(frozen=True)
class BusySummary:
    """What a tuning run saw of the machine's load.

    Fields: `batches` measured and `busy_batches` among them with a timing past the bound; `worst` the largest
    slowdown of the calibration kernel; `marked` measurements marked busy; `remeasured` marked programs measured
    again in a later batch (when the machine was quiet); `calibration_s` the time spent timing the kernel, of
    `measure_s`, the batches' wall time (building and running included)."""

    batches: int = 0
    busy_batches: int = 0
    worst: float = 1.0
    marked: int = 0
    remeasured: int = 0
    calibration_s: float = 0.0
    measure_s: float = 0.0

    @property
    def overhead(self) -> float:
        """The calibrations' share of the batches' time."""
        return self.calibration_s / self.measure_s if self.measure_s > 0 else 0.0

    def warning(self) -> str:
        """One line on what was seen ("" when the machine was never busy)."""
        if not self.busy_batches:
            return ""
        plural = "es" if self.batches != 1 else ""
        if self.remeasured >= self.marked:
            again = "all of them were measured again while it was quiet"
        elif self.remeasured:
            again = (f"{self.remeasured} of them were measured again while it was quiet, the rest will be by the next "
                     "run on this database")
        else:
            again = "they will be measured again by the next run on this database (a quiet one gives the right times)"
        return (f"the machine was busy during {self.busy_batches} of {self.batches} batch{plural} (calibration "
                f"kernel up to {self.worst:.1f}x slower than quiet); their {self.marked} measurements are marked and "
                f"count as no program's time; {again} ({BOUND_ENV}=0: take the times of a busy machine as they come)")

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "overhead": self.overhead}


@dataclass
class BusyWatch:
    """Times `runner`'s calibration kernel around the batches of a tuning run and marks their results (see the
    module docstring); `bound` 0 (or a runner that cannot tell) marks nothing and times nothing."""

    runner: Runner
    bound: float
    interval_s: float = INTERVAL_S
    seen: BusySummary = BusySummary()
    latest: float = 1.0  # the slowdown at the last timing
    _checked: float = -float("inf")  # perf_counter() of the last timing
    _window: float = 1.0  # the largest slowdown of the batch so far
    _started: float = 0.0

    def check(self, task: SearchTask) -> float:
        """Time the kernel now; returns the slowdown that marks what was measured since the last timing (the larger
        of the two)."""
        before = self.latest
        if self.bound > 0:
            t0 = time.perf_counter()
            now = self.runner.slowdown(task)
            self._checked = time.perf_counter()
            self.seen = replace(self.seen, calibration_s=self.seen.calibration_s + self._checked - t0)
            self.latest = now if now is not None else 1.0
        self._window = max(self._window, self.latest)
        return max(before, self.latest)

    def due(self) -> bool:
        """Whether the results held are to be marked and committed now: the last timing is more than `interval_s`
        old, or the watch is off (then nothing is held)."""
        return self.bound <= 0 or time.perf_counter() - self._checked > self.interval_s

    def current(self, task: SearchTask) -> float:
        """The slowdown that marks a measurement just taken: the last timing's, timed again if it is old."""
        return self.check(task) if self.due() else self.latest

    def begin_batch(self, task: SearchTask) -> bool:
        """A batch of `task` is about to be measured: time the kernel; whether the machine is quiet."""
        self._started = time.perf_counter()
        self._window = 1.0
        self.latest = 1.0  # the batch before ended with a timing of its own
        self.check(task)
        return self.bound <= 0 or self.latest <= self.bound

    def end_batch(self, remeasured: int) -> None:
        """Count the batch that ends (after its last results were marked); `remeasured` of its programs were
        marked ones measured again."""
        busy = self.bound > 0 and self._window > self.bound
        self.seen = replace(self.seen, batches=self.seen.batches + 1, busy_batches=self.seen.busy_batches + busy,
                            worst=max(self.seen.worst, self._window), remeasured=self.seen.remeasured + remeasured,
                            measure_s=self.seen.measure_s + time.perf_counter() - self._started)

    def mark(self, result: MeasureResult, slowdown: float) -> MeasureResult:
        """`result` marked busy if it succeeded while the calibration kernel ran past the bound."""
        if not (result.ok and self.bound > 0 and slowdown > self.bound):
            return result
        self.seen = replace(self.seen, marked=self.seen.marked + 1)
        return replace(result, error_kind=ErrorKind.BUSY,
                       error_msg=f"measured while the machine was busy: the calibration kernel ran {slowdown:.1f}x "
                                 f"slower than quiet (bound {self.bound:g}x); measured again when it is quiet")
