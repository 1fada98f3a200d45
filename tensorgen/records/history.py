"""What tuning did, over time: its runs (one per `tune()` or `TaskScheduler.tune()` call) and a light row per
measurement (when, which run and round, how fast), which the tuning report draws its curves from without decoding
any program.

Databases written before runs existed have measurements without a run or round (None): readers show what the
timestamps alone tell.
"""

from __future__ import annotations

import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Measurement:
    """One row of the records table, without its program: `cost` in seconds (inf: failed), `created` the Unix time
    it was committed, `run` and `round` None where the database predates them."""

    id: int
    workload_key: str
    target: str
    cost: float
    error_kind: str
    steps_hash: str
    created: float
    run: int | None = None
    round: int | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind == "none" and math.isfinite(self.cost)


@dataclass(frozen=True)
class Run:
    """One tuning run: when it started and finished (None: killed, or still running), what it was asked to do
    (`info`: the command, kind, name, budget, target, ...) and how it ended (`outcome`: trials, why it stopped)."""

    id: int
    started: float
    finished: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    outcome: dict[str, Any] = field(default_factory=dict)


def command_line(argv: list[str] | None = None) -> str:
    """This process's command line as a shell takes it, the program by its name (`tensorgen tune ...`)."""
    args = list(sys.argv if argv is None else argv) or ["python"]
    return shlex.join([Path(args[0]).name or args[0], *args[1:]])
