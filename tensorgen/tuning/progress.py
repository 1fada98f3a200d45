"""What the tuners report: a row per task, the progress record the task scheduler's callbacks see, the result of a
run, the live table (Ansor's "ID | Task | FLOPs | Weight | Latency | GFLOP/s | Trials") that `tensorgen tune MODEL`
prints, and the status line of one task's tune(). The Python API's tune() and TaskScheduler.tune show the same
on stderr where it is a terminal (`progress=None`), or as told (`progress=True`/`False`)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from tensorgen.schedule.state import State
from tensorgen.task import SearchTask
from tensorgen.tuning.busy import BusySummary

if TYPE_CHECKING:  # tune.py shows its progress with ProgressLine
    from tensorgen.tuning.tune import TuneProgress

RESUMED_NOTE = "resumed from the database"


@dataclass(frozen=True)
class TaskRow:
    """One task as the scheduler sees it: latency in seconds (inf until a valid measurement), trials
    (database records included) and rounds allocated."""

    index: int
    desc: str
    flops: float
    weight: float
    latency: float
    trials: int
    rounds: int

    @property
    def gflops(self) -> float:
        return self.flops / self.latency / 1e9 if 0 < self.latency < math.inf else 0.0


class StopTuning(Exception):
    """Raised by a scheduler callback to end the run after the round it saw (ScheduleResult.stopped "callback"):
    e.g. once the estimate reaches a target. Every measured record is in the database."""


@dataclass(frozen=True)
class SchedulerProgress:
    """What a callback sees after the resume (phase "resume"), after every round (phase "round") and after the
    tasks' bests were re-timed at the end (phase "confirm").

    `models` is each model's estimated latency (sum of weight x best latency, seconds; None while one of
    its tasks has no valid measurement); `objective` the objective at the current bests (None likewise).
    """

    phase: str
    rounds: int  # rounds run in this call
    task: int | None  # the task of the last round
    measured: int  # programs measured in the last round
    trials_done: int  # measured in this call
    trials: int  # this call's budget
    rows: tuple[TaskRow, ...]
    models: dict[str, float | None]
    objective: float | None
    elapsed_s: float


@dataclass
class ScheduleResult:
    """The outcome of one scheduler run. `stopped`: "budget", "converged" (no task can lower the objective),
    "exhausted" (every task ran out of new programs or stopped early), "callback" (a callback raised StopTuning)
    or "interrupted"."""

    tasks: list[SearchTask]
    rows: tuple[TaskRow, ...]
    best_states: list[State | None]
    models: dict[str, float | None]
    trials: int
    rounds: int
    stopped: str
    wall_s: float
    skipped: dict[str, int] = field(default_factory=dict)  # search operations that raised, per kind (search.skips)
    # where the time went, summed over the tasks: the search itself (proposals, cost-model updates, the resume),
    # building and running the programs measured (RoundTuner.seconds)
    search_s: float = 0.0
    build_s: float = 0.0
    run_s: float = 0.0
    busy: BusySummary = BusySummary()  # the machine's load seen while measuring (tuning.busy)

    @property
    def best_costs(self) -> list[float]:
        return [r.latency for r in self.rows]

    @property
    def interrupted(self) -> bool:
        return self.stopped == "interrupted"

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (each task's best program as its step list JSON)."""
        def seconds(x: float | None) -> float | None:
            return x if x is not None and math.isfinite(x) else None

        tasks = [{"workload_key": t.workload_key, "desc": r.desc, "flops": r.flops, "weight": r.weight,
                  "best_seconds": seconds(r.latency), "gflops": r.gflops, "trials": r.trials, "rounds": r.rounds,
                  "best_steps": s.to_json() if s is not None else None}
                 for t, r, s in zip(self.tasks, self.rows, self.best_states)]
        return {"tasks": tasks, "models": {k: seconds(v) for k, v in self.models.items()}, "trials": self.trials,
                "rounds": self.rounds, "stopped": self.stopped, "wall_s": self.wall_s, "skipped": dict(self.skipped),
                "search_s": self.search_s, "build_s": self.build_s, "run_s": self.run_s, "busy": self.busy.to_dict()}


SchedulerCallback = Callable[[SchedulerProgress], None]


# ---------------------------------------------------------------------------------------------
# the live table


def eta(done: int, total: int, elapsed_s: float) -> str:
    """"ETA 1m05s": the time the `total - done` trials left take at the rate of the `done` ones in `elapsed_s`
    ("" before the first trial and after the last)."""
    if done <= 0 or done >= total or elapsed_s <= 0:
        return ""
    left = round((total - done) * elapsed_s / done)
    hours, rest = divmod(left, 3600)
    minutes, seconds = divmod(rest, 60)
    return "ETA " + (f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s")


def format_table(p: SchedulerProgress, desc_width: int = 32, resumed_s: float = 0.0) -> list[str]:
    """Ansor's progress table ("ID | Task | FLOPs | Weight | Latency (ms) | GFLOP/s | Trials") and the
    estimated latency of each model; the ETA counts the time after `resumed_s` (when the rounds began)."""
    head = ("ID", "Task", "FLOPs", "Weight", "Latency (ms)", "GFLOP/s", "Trials")
    rows = [(str(r.index), _clip(r.desc, desc_width), _si(r.flops), f"{r.weight:g}",
             f"{r.latency * 1e3:.4f}" if math.isfinite(r.latency) else "-",
             f"{r.gflops:.2f}" if r.gflops > 0 else "-", str(r.trials)) for r in p.rows]
    widths = [max(len(c) for c in col) for col in zip(head, *rows)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) if k == 1 else c.rjust(w)
                                            for k, (c, w) in enumerate(zip(cells, widths))) + " |"
    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]
    models = ", ".join(f"{name} {_ms(s)}" for name, s in p.models.items())
    out.append(f"Estimated total latency: {models}")
    left = eta(p.trials_done, p.trials, p.elapsed_s - resumed_s)
    out.append(f"Trials: {p.trials_done}/{p.trials} | rounds: {p.rounds}"
               + (f" | last: task {p.task}" if p.task is not None else "") + f" | {p.elapsed_s:.1f} s"
               + (f" | {left}" if left else ""))
    return out


@dataclass
class ProgressTable:
    """A scheduler callback printing the live table: redrawn in place on a TTY; otherwise the table after
    the resume, one plain line per round, and the table again at `close()`."""

    stream: TextIO = field(default_factory=lambda: sys.stdout)
    tty: bool | None = None
    _drawn: int = field(default=0, init=False)
    _last: SchedulerProgress | None = field(default=None, init=False)
    _resumed_s: float = field(default=0.0, init=False)  # when the rounds began, for the ETA

    def __post_init__(self) -> None:
        if self.tty is None:
            self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, p: SchedulerProgress) -> None:
        self._last = p
        if p.phase == "resume":
            self._resumed_s = p.elapsed_s
        if self.tty:
            lines = format_table(p, resumed_s=self._resumed_s)
            clear = f"\x1b[{self._drawn}F\x1b[J" if self._drawn else ""
            self.stream.write(clear + "\n".join(lines) + "\n")
            self._drawn = len(lines)
        elif p.phase == "resume":
            self.stream.write("\n".join(format_table(p)) + "\n")
        elif p.phase == "round":
            r = p.rows[p.task] if p.task is not None else None
            best = f"{_ms(r.latency)} ({r.gflops:.2f} GFLOP/s)" if r is not None and r.gflops > 0 else "-"
            models = ", ".join(f"{name} {_ms(s)}" for name, s in p.models.items())
            left = eta(p.trials_done, p.trials, p.elapsed_s - self._resumed_s)
            self.stream.write(f"[schedule] round {p.rounds}: task {p.task} "
                              f"({_clip(r.desc if r else '', 32)}) +{p.measured} trials, best {best}; "
                              f"estimated {models}; {p.trials_done}/{p.trials} trials, {p.elapsed_s:.1f} s"
                              + (f", {left}" if left else "") + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Print the final table where it was not redrawn live."""
        if not self.tty and self._last is not None and self._last.phase != "resume":
            self.stream.write("\n".join(format_table(self._last, resumed_s=self._resumed_s)) + "\n")
            self.stream.flush()
        self._last, self._drawn = None, 0


@dataclass
class ProgressLine:
    """A tune() callback writing one status line: rewritten in place on a TTY, one line per batch otherwise."""

    stream: TextIO = field(default_factory=lambda: sys.stderr)
    tty: bool | None = None
    _width: int = field(default=0, init=False)
    _resumed_s: float = field(default=0.0, init=False)  # when the batches began, for the ETA
    _resumed: int = field(default=0, init=False)  # programs the database held at the resume

    def __post_init__(self) -> None:
        if self.tty is None:
            self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, p: TuneProgress) -> None:
        if p.phase == "resume":  # counted here: a resumed program measured again is in trials_done and total_trials
            self._resumed_s, self._resumed = p.elapsed_s, p.total_trials
        best = f"{p.best_gflops:.2f} GFLOP/s" if p.best_gflops > 0 else "-"
        extra = f" (+{self._resumed} {RESUMED_NOTE})" if self._resumed else ""
        left = eta(p.trials_done, p.trials, p.elapsed_s - self._resumed_s)
        line = (f"[tune {p.task.desc or p.task.workload_key}] {p.trials_done}/{p.trials} trials{extra}  "
                f"best {best}  errors {p.errors}  {p.elapsed_s:.1f}s" + (f"  {left}" if left else ""))
        if self.tty:
            self.stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the in-place line so later output starts on its own line."""
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


def shows_progress(progress: bool | None) -> bool:
    """Whether the Python API shows its progress on stderr.

    Args:
        progress: True or False as the caller says; None: where stderr is a terminal, as the CLI does (a
            notebook's or a log file's stderr is not one: quiet there unless asked).
    """
    if progress is not None:
        return progress
    return sys.stderr is not None and sys.stderr.isatty()


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.4f} ms" if seconds is not None and math.isfinite(seconds) else "-"


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:g}"


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
