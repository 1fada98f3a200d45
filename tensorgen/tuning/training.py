"""Training a cost model offline from tuning databases (Pruner §2.5's pretraining, TenSet's data): the measured
programs of every task in the databases, their features and throughputs, grouped by task; and the quality of a
model's ranking on tasks it was not trained on (pairwise accuracy, recall@k, and TenSet's top-k: the best latency
of a task over the latency of the best of the model's k first picks).

Every record is replayed on its own workload's DAG and its features are extracted under the hardware parameters
it was measured with (a record of an AVX2 target keeps its 8-lane features on an AVX-512 machine).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tensorgen.costmodel.base import CostModel
from tensorgen.costmodel.metrics import pairwise_accuracy, recall_at_k
from tensorgen.errors import TensorgenError
from tensorgen.features.extractor import FeatureExtractor
from tensorgen.records.database import SQLiteDatabase
from tensorgen.records.record import first_records, program_cost
from tensorgen.target import HardwareParams


@dataclass
class TaskData:
    """The measured programs of one task (workload and target) of a database."""

    workload_key: str
    target: str
    desc: str
    flop: float
    features: list[np.ndarray]
    throughputs: np.ndarray  # flop / seconds; 0 for a failed measurement

    @property
    def group(self) -> str:
        return f"{self.workload_key}|{self.target}"


@dataclass
class TrainingSet:
    tasks: list[TaskData] = field(default_factory=list)
    unreplayable: int = 0
    seconds: float = 0.0

    @property
    def programs(self) -> int:
        return sum(len(t.features) for t in self.tasks)

    def arrays(self) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """(features, throughputs, groups) of every program, as CostModel.update takes them."""
        feats = [f for t in self.tasks for f in t.features]
        y = np.concatenate([t.throughputs for t in self.tasks]) if self.tasks else np.zeros(0)
        groups = np.array([t.group for t in self.tasks for _ in t.features])
        return feats, y, groups

    def split(self, held_out: float, seed: int = 0,
              workloads: Collection[str] = ()) -> tuple[TrainingSet, TrainingSet]:
        """Tasks (not programs) split: (training, held-out). Held out: every task of `workloads` (workload keys,
        e.g. a model's, so that none of its tasks is trained on) and `held_out`, a share of the others drawn at
        random."""
        keep = [i for i, t in enumerate(self.tasks) if t.workload_key not in workloads]
        order = np.random.default_rng(seed).permutation(len(keep))
        n = int(round(held_out * len(keep)))
        train = {keep[i] for i in order[n:]}
        return (TrainingSet([t for i, t in enumerate(self.tasks) if i in train]),
                TrainingSet([t for i, t in enumerate(self.tasks) if i not in train]))


def load_training_set(paths: Sequence[str | Path], dataflow: bool = True, min_programs: int = 2,
                      progress: Callable[[str], None] | None = None) -> TrainingSet:
    """The measured programs of every task in the databases at `paths` (tasks with fewer than `min_programs`
    replayable records are left out: a ranking needs two); `dataflow` appends PaCM's data-flow row."""
    out = TrainingSet()
    t0 = time.perf_counter()
    for path in paths:
        if not Path(path).is_file():
            raise TensorgenError(f"no database at {path}")
        with SQLiteDatabase(path, readonly=True) as db:
            for key, target, _ in db.workloads():
                task = _task(db, key, target, dataflow, out)
                if task is not None and len(task.features) >= min_programs:
                    out.tasks.append(task)
        if progress is not None:
            progress(f"{path}: {len(out.tasks)} tasks, {out.programs} programs so far")
    out.seconds = time.perf_counter() - t0
    return out


def _task(db: SQLiteDatabase, key: str, target: str, dataflow: bool, out: TrainingSet) -> TaskData | None:
    records = first_records(db.records(key, target))
    if not records:
        return None
    dag = records[0].compute_dag
    states, costs = [], []
    for rec in records:
        try:
            states.append(rec.state(dag))
        except TensorgenError:
            out.unreplayable += 1
            continue
        valid = [c for c in rec.result.costs if math.isfinite(c) and c > 0]
        costs.append(program_cost(valid) if rec.ok else math.inf)
    if not states:
        return None
    hw = HardwareParams.from_dict(records[0].hw)
    feats = FeatureExtractor(hw, capacity=len(states) + 1, dataflow=dataflow).extract(states)
    cost = np.array(costs)
    flop = float(dag.flop_count)
    y = np.where(np.isfinite(cost) & (cost > 0), flop / np.where(cost > 0, cost, 1.0), 0.0)
    desc = "_".join(t.name for t in dag.compute_tensors)[:48]
    return TaskData(key, target, desc, flop, feats, y)


def ranking_quality(model: CostModel, data: TrainingSet, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """How `model` ranks each task's programs: mean pairwise accuracy and recall@10 over tasks, and TenSet's top-k
    (sum of each task's best latency over the sum of the best latency among the model's k first picks: 1.0 means
    the first pick is always the fastest), for each k of `ks`."""
    pairs, recalls, best, picked = [], [], 0.0, {k: 0.0 for k in ks}
    for task in data.tasks:
        y = task.throughputs
        if not np.any(y > 0):
            continue
        score = np.asarray(model.predict(task.features), dtype=np.float64)
        pairs.append(pairwise_accuracy(y, score))
        recalls.append(recall_at_k(y, score, min(10, len(y))))
        latency = np.where(y > 0, task.flop / np.where(y > 0, y, 1.0), np.inf)
        order = np.argsort(-np.where(np.isfinite(score), score, -np.inf), kind="stable")
        best += float(latency.min())
        for k in ks:
            picked[k] += float(latency[order[:k]].min())
    out = {"tasks": float(len(pairs)), "pairwise": float(np.mean(pairs)) if pairs else math.nan,
           "recall@10": float(np.mean(recalls)) if recalls else math.nan}
    for k in ks:
        out[f"top-{k}"] = best / picked[k] if picked[k] > 0 and math.isfinite(picked[k]) else 0.0
    return out
