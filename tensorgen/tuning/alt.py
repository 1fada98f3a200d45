"""ALT's joint layout and loop tuning of one task (§5): a joint stage, then a loop-only stage.

The joint stage explores layouts: each candidate (the task's own layout first, then tilings sampled from the
layout template, search.layouts) is the task's DAG laid out (schedule.layout.lay_out), a task of its own whose
loops the Ansor search tunes; the best program found is that layout's reward. The joint budget goes in one
equal share each (default) or in rungs of successive halving (the better half of the layouts tunes on). The
loop-only stage spends the rest of the budget on the best layout's loops, resuming from its records. The
result is a state of the original task: its layout steps, then the loop steps (replayable from the record of
the task's DAG).

This is the paper's cross exploration with its PPO layout actor replaced by sampling from the template's space
and successive halving (not built: PPO, and the evolutionary variant with layout genes).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensorgen.dag import ComputeDAG
from tensorgen.errors import TuneError
from tensorgen.records.database import Database, SQLiteDatabase
from tensorgen.records.record import Record
from tensorgen.schedule.layout import lay_out
from tensorgen.schedule.state import State
from tensorgen.search.layouts import LAYOUT_TEMPLATES, Layouts
from tensorgen.target import Target
from tensorgen.task import SearchTask
from tensorgen.te.tensor import Tensor
from tensorgen.tuning.tune import MeasureConfig, TuneResult, make_task, tune

EXPLORATIONS = ("halving", "uniform")


def exploration_rungs(count: int, budget: int, exploration: str) -> list[int]:
    """Trials per surviving layout in each rung of the joint stage. "uniform": one rung, an equal share each.
    "halving" (successive halving): the better half of the layouts goes on to the next rung, each rung spends
    about the same trials in all, so the layouts that stay longest get the most."""
    if exploration == "uniform" or count == 1:
        return [max(1, budget // count)]
    alive, sizes = count, []
    while alive > 1:
        sizes.append(alive)
        alive = max(1, alive // 2)
    sizes.append(1)
    return [max(1, budget // len(sizes) // n) for n in sizes]


@dataclass(frozen=True)
class AltConfig:
    """layouts: candidates in the joint stage (the task's own included); joint_fraction: the share of the
    trials they get together; template: a name of search.layouts.LAYOUT_TEMPLATES; exploration: how the joint
    budget is spread over the layouts (EXPLORATIONS)."""

    layouts: int = 4
    joint_fraction: float = 0.5
    template: str = "tiling"
    exploration: str = "uniform"  # or "halving" (bench/results/alt_s19.md: no better, and slower, so far)

    def __post_init__(self) -> None:
        if self.layouts < 1 or not 0 < self.joint_fraction <= 1 or self.template not in LAYOUT_TEMPLATES \
                or self.exploration not in EXPLORATIONS:
            raise TuneError(f"bad ALT config {self}: need layouts >= 1, 0 < joint_fraction <= 1, a template of "
                            f"{sorted(LAYOUT_TEMPLATES)} and an exploration of {EXPLORATIONS}")


@dataclass(frozen=True)
class LayoutTrial:
    layouts: Layouts
    best_cost: float  # seconds; inf when nothing measured ran
    trials: int  # measured for this layout in the joint stage


@dataclass(frozen=True)
class AltResult:
    task: SearchTask
    layouts: Layouts  # the chosen layout of each tensor ({}: the task's own)
    best_state: State | None  # on task.dag: layout steps, then loop steps
    best_cost: float
    trials: int
    tuning_wall_s: float
    explored: list[LayoutTrial] = field(default_factory=list)

    @property
    def best_gflops(self) -> float:
        return self.task.dag.flop_count / self.best_cost / 1e9 if self.best_state is not None else 0.0


def layout_candidates(task: SearchTask, count: int, template: str, rng: np.random.Generator) -> list[Layouts]:
    """The task's own layout, then up to count - 1 distinct tilings from the template (fewer if it has fewer)."""
    tmpl = LAYOUT_TEMPLATES[template]
    space = tmpl.space(task.dag)
    found: list[Layouts] = [{}]
    if space is None:
        return found
    seen = {"{}"}
    for _ in range(50 * count):
        if len(found) >= count:
            break
        layouts = tmpl.layouts(task.dag, space.sample(rng))
        key = repr({k: [p.to_json() for p in v] for k, v in sorted(layouts.items())})
        if key not in seen:
            seen.add(key)
            found.append(layouts)
    return found


def laid_out_task(task: SearchTask, layouts: Layouts) -> SearchTask:
    if not layouts:
        return task
    return SearchTask(lay_out(task.dag, layouts), task.target, task.hw, desc=task.desc)


def tune_alt(task_or_dag: SearchTask | ComputeDAG | Tensor | Sequence[Tensor], trials: int, *,
             db: str | Path | Database | None = None, target: str | Target = "cpu",
             config: AltConfig = AltConfig(), seed: int = 0, measure: MeasureConfig | None = None,
             batch_size: int = 16, policy_options: dict[str, Any] | None = None) -> AltResult:
    """Joint stage over `config.layouts` layouts, then the loop-only stage on the best (module docstring). Takes
    what `tune` takes; the records are the laid-out tasks' and, when a layout of its own wins, one of the task
    itself (its layout steps, then its loops)."""
    task = make_task(task_or_dag, target)
    if trials < 1:
        raise TuneError(f"tune_alt needs trials >= 1, got {trials}")
    t0, measure = time.perf_counter(), measure or MeasureConfig()
    database = SQLiteDatabase.in_memory() if db is None else SQLiteDatabase(db) if isinstance(db, (str, Path)) else db
    try:
        return _tune_alt(task, trials, database, config, seed, measure, batch_size, policy_options, t0)
    finally:
        if database is not db:
            database.close()


def _tune_alt(task: SearchTask, trials: int, db: Database, config: AltConfig, seed: int, measure: MeasureConfig,
              batch_size: int, policy_options: dict[str, Any] | None, t0: float) -> AltResult:
    candidates = layout_candidates(task, config.layouts, config.template, np.random.default_rng(seed))
    joint = max(len(candidates), int(trials * config.joint_fraction))
    rungs = exploration_rungs(len(candidates), joint, config.exploration)
    variants = [laid_out_task(task, layouts) for layouts in candidates]
    last: dict[int, TuneResult] = {}  # candidate -> its latest tune() result (the best so far: tune resumes)
    spent = [0] * len(candidates)
    alive, used = list(range(len(candidates))), 0
    for k, share in enumerate(rungs):
        for i in alive:  # every survivor tunes `share` more trials, resuming from the database
            last[i] = tune(variants[i], share, db=db, seed=seed + k, measure=measure,
                           batch_size=min(batch_size, share), policy_options=policy_options)
            spent[i] += last[i].trials
            used += share
        if k + 1 < len(rungs):
            alive = sorted(alive, key=lambda i: last[i].best_cost)[:max(1, len(alive) // 2)]
    chosen = min(last, key=lambda i: last[i].best_cost)
    best_layouts, best_task, best = candidates[chosen], variants[chosen], last[chosen]
    if trials > used:
        best = tune(best_task, trials - used, db=db, seed=seed + 1, measure=measure, batch_size=batch_size,
                    policy_options=policy_options)
    state = None
    if best.best_state is not None:
        state = State(task.dag)
        for name, prims in best_layouts.items():
            state.transform_layout(name, prims)
        for step in best.best_state.steps:  # after the layout steps: steps naming earlier steps renumber
            state.apply(step.shifted(len(best_layouts)))
        measured = db.best(best_task.workload_key, str(task.target))
        if best_layouts and measured is not None:  # the task's own record: its layout steps, then its loops
            db.commit_record(Record.from_measure(task, state, measured.result))
    explored = [LayoutTrial(layouts, last[i].best_cost, spent[i]) for i, layouts in enumerate(candidates)]
    return AltResult(task, best_layouts, state, best.best_cost, max(trials, used), time.perf_counter() - t0,
                     explored)
