"""SearchTask: one thing to tune — a DAG on a target with known hardware parameters."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from tensorgen.dag import ComputeDAG
from tensorgen.schedule.replay import PrefixReplayer
from tensorgen.target import HardwareParams, Target


@dataclass(frozen=True, eq=False)
class SearchTask:
    dag: ComputeDAG
    target: Target
    hw: HardwareParams
    desc: str = ""

    @cached_property
    def workload_key(self) -> str:
        return self.dag.workload_key

    @cached_property
    def key(self) -> str:
        """Stable identity of (workload, target)."""
        return hashlib.sha256(f"{self.dag.workload_key}|{self.target}".encode()).hexdigest()[:24]

    @cached_property
    def replayer(self) -> PrefixReplayer:
        """Replays step lists of this task, sharing prefixes (per process: not pickled)."""
        return PrefixReplayer(self.dag)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "replayer"}

    def __repr__(self) -> str:
        return f"SearchTask({self.desc or self.workload_key}, target={self.target})"
