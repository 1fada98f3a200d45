"""Skips: search operations that raised, skipped and counted, so that a bug in one rule, sample, mutation or
model update costs that operation and not the tuning run.

Every step of the search that runs code a user's model can drive into a corner (a sketch rule, a random
annotation, a mutation, a crossover, feature extraction, a cost-model update or prediction, a search worker)
runs under `Skips.guard(kind, context)`: an exception there is counted under `kind`, the first one of each
(kind, context, exception type) is logged with the line that raised, and the caller goes on as if the
operation had produced nothing. ScheduleError and LoweringError are not faults — rules and samples raise them
for programs that do not exist, and callers handle them as before; KeyboardInterrupt and SystemExit pass.
The counts go in the tuning summaries (TuneResult.skipped, ScheduleResult.skipped).
"""

from __future__ import annotations

import logging
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

LOGGER = logging.getLogger("tensorgen.search")


@dataclass
class Skips:
    """Failed search operations per kind; `log=False` (a search worker's) leaves logging to whoever absorbs it."""

    counts: Counter = field(default_factory=Counter)
    first: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (kind, context, type) -> message
    log: bool = True

    @contextmanager
    def guard(self, kind: str, context: str) -> Iterator[None]:
        """Run the block; an exception in it is noted (see `note`) and swallowed."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - the point: any bug of one operation is skipped
            self.note(kind, context, exc)

    def note(self, kind: str, context: str, exc: BaseException) -> None:
        self.counts[kind] += 1
        key = (kind, context, type(exc).__name__)
        if key not in self.first:
            where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ is not None else []
            at = f" at {where[0].filename}:{where[0].lineno}" if where else ""
            self._first(key, f"{type(exc).__name__}: {exc}{at}")

    def absorb(self, other: Skips) -> None:
        """Add another Skips' counts (a search worker's), logging the failures not seen here yet."""
        self.counts.update(other.counts)
        for key, message in other.first.items():
            if key not in self.first:
                self._first(key, message)

    def _first(self, key: tuple[str, str, str], message: str) -> None:
        self.first[key] = message
        if self.log:
            LOGGER.warning("skipped a failed %s (%s): %s; the search goes on without it (further failures of it "
                           "are only counted)", key[0], key[1], message)

    def summary(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))
