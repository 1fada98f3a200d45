"""Reuse tuning results: the best measured program for a workload, replayed on the caller's DAG."""

from __future__ import annotations

from tensorgen.dag import ComputeDAG
from tensorgen.records.database import Database
from tensorgen.schedule.state import State
from tensorgen.target import Target


def apply_best(dag: ComputeDAG, target: str | Target, db: Database) -> State | None:
    """The fastest successful record for `dag` on `target`, as a State on `dag` itself; None if untuned.

    Replaying on the caller's DAG (not the embedded copy) keeps the caller's Tensor objects, so the
    state builds into a function with exactly the arguments the caller defined.
    """
    record = db.best(dag.workload_key, str(Target.parse(target)))
    return None if record is None else record.state(dag)
