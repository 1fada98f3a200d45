"""What one task's tuning has measured so far: the progress its callbacks see, and the counters and best program
TaskTuner keeps between rounds."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tensorgen.measure.types import MeasureInput, MeasureResult
from tensorgen.records.record import program_cost, steps_hash
from tensorgen.schedule.state import State
from tensorgen.task import SearchTask

RETIMES = 2  # a program that becomes a task's best is measured this many more times; its cost is the median


@dataclass(frozen=True)
class TuneProgress:
    """What a callback sees after the resume (`phase="resume"`) and after every measured batch."""

    task: SearchTask
    phase: str  # "resume" | "batch"
    trials_done: int  # measured in this call
    trials: int  # this call's budget
    total_trials: int  # programs of this workload + target, resumed ones included (a re-timing is not a new trial)
    best_cost: float  # seconds, inf until something succeeded
    best_gflops: float
    errors: int  # failed measurements in this call
    elapsed_s: float
    inputs: tuple[MeasureInput, ...] = ()  # the batch just measured
    results: tuple[MeasureResult, ...] = ()


Callback = Callable[[TuneProgress], None]


@dataclass
class Tally:
    """Counters of one task's tuning; the best program over resumed and new measurements.

    A program measured more than once (re-timed as a new best, see TaskTuner.round) costs the upper median
    of its measurements, as `Database.top_k` ranks it: one disturbed measurement neither makes nor keeps a
    best."""

    task: SearchTask
    trials: int
    since: float  # perf_counter() when the current resume()/round() began
    done: int = 0
    costs: list[float] = field(default_factory=list)  # every program's first measurement (resumed first), inf: failed
    best_cost: float = math.inf
    best_state: State | None = None
    seen: set[str] = field(default_factory=set)  # step hashes measured
    runs: dict[str, list[float]] = field(default_factory=dict)  # step hash -> that program's valid costs
    states: dict[str, State] = field(default_factory=dict)  # step hash -> program, for those with a valid cost
    best_key: str | None = None
    errors: Counter = field(default_factory=Counter)
    policy_s: float = 0.0
    build_s: float = 0.0
    run_s: float = 0.0
    busy_s: float = 0.0  # wall time spent in resume() and round()
    retimed: int = 0  # measurements that re-timed a best program

    def observe(self, state: State | None, result: MeasureResult) -> None:
        """One measurement; a program's second and later ones (re-timings) change its cost, not `costs`."""
        cost = result.median_cost if result.ok and state is not None else math.inf
        cost = cost if math.isfinite(cost) else math.inf
        key = steps_hash(state.to_json()) if state is not None else None
        if key is None or key not in self.seen:
            self.costs.append(cost)
        if key is None:
            return
        self.seen.add(key)
        if not math.isfinite(cost):
            return
        self.runs.setdefault(key, []).append(cost)
        self.states.setdefault(key, state)
        if key == self.best_key or program_cost(self.runs[key]) < self.best_cost:
            self.best_key = min(self.runs, key=lambda k: program_cost(self.runs[k]))
            self.best_cost, self.best_state = program_cost(self.runs[self.best_key]), self.states[self.best_key]

    def confirmed(self) -> bool:
        """Whether the best program has been measured 1 + RETIMES times (or there is none)."""
        return self.best_key is None or len(self.runs[self.best_key]) > RETIMES

    @property
    def best_gflops(self) -> float:
        return self.task.dag.flop_count / self.best_cost / 1e9 if 0 < self.best_cost < math.inf else 0.0

    def progress(self, phase: str, inputs: Sequence[MeasureInput] = (),
                 results: Sequence[MeasureResult] = ()) -> TuneProgress:
        return TuneProgress(self.task, phase, self.done, self.trials, len(self.costs), self.best_cost,
                            self.best_gflops, sum(self.errors.values()),
                            self.busy_s + time.perf_counter() - self.since, tuple(inputs), tuple(results))
