"""Watch streaks of failed measurements: log the first few in full, then only count and summarize.

A search that generates broken candidates can fail thousands of times in a row; logging each one drowns
the log, logging none hides the problem. The guard never catches anything, it only observes results.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from tensorgen.errors import TensorgenError
from tensorgen.measure.types import BuildResult, ErrorKind, MeasureResult

LOGGER_NAME = "tensorgen.measure"


class TooManyErrors(TensorgenError):
    """More consecutive measurement errors than `ErrorGuard.max_consecutive` allows."""


@dataclass
class ErrorGuard:
    """Counts consecutive errors by kind; logs the first `log_first` in full and a summary every
    `summary_every` errors and when a success ends the streak. `max_consecutive` (if set) raises."""

    log_first: int = 5
    summary_every: int = 50
    max_consecutive: int | None = None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger(LOGGER_NAME))
    streak: Counter = field(default_factory=Counter, init=False)
    total_errors: int = field(default=0, init=False)
    total_ok: int = field(default=0, init=False)

    @property
    def consecutive(self) -> int:
        return sum(self.streak.values())

    def summary(self) -> str:
        """E.g. "37 consecutive errors: 30 compile_error, 7 run_timeout"."""
        kinds = ", ".join(f"{n} {kind}" for kind, n in self.streak.most_common())
        n = self.consecutive
        return f"{n} consecutive error{'' if n == 1 else 's'}" + (f": {kinds}" if kinds else "")

    def observe(self, result: MeasureResult | BuildResult, what: str = "") -> None:
        """Record one candidate's outcome; `what` names the candidate in log lines."""
        if result.error_kind == ErrorKind.NONE:
            self.total_ok += 1
            if self.streak:
                self.logger.warning("%s, ended by a success", self.summary())
                self.streak.clear()
            return
        self.total_errors += 1
        self.streak[result.error_kind.value] += 1
        n = self.consecutive
        if n <= self.log_first:
            label = f" {what}" if what else ""
            self.logger.warning("measure error%s (%s): %s", label, result.error_kind.value, result.error_msg)
            if n == self.log_first:
                self.logger.warning("further errors in this streak are only counted")
        elif self.summary_every > 0 and n % self.summary_every == 0:
            self.logger.warning("%s so far", self.summary())
        if self.max_consecutive is not None and n >= self.max_consecutive:
            raise TooManyErrors(f"{self.summary()} (limit {self.max_consecutive})")
