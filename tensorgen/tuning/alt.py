"""ALT's joint layout and loop tuning of one task (§5): a joint stage, then a loop-only stage.

The joint stage explores layouts: each candidate (the task's own layout first, then tilings sampled from the
layout template, search.layouts) is the task's DAG laid out (schedule.layout.lay_out), a task of its own whose
loops the Ansor search tunes for an equal share of the joint budget; the best program found is that layout's
reward. The loop-only stage spends the rest of the budget on the best layout's loops, resuming from the records
its joint share left in the database. The result is a state of the original task: its layout steps, then the
loop steps (replayable from the record of the task's DAG).

This is the paper's cross exploration with the layout actor replaced by sampling without replacement from the
template's space (its PPO actors are not built); the issue's evolutionary variant with layout genes neither.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensorgen.errors import TuneError
from tensorgen.records.database import Database
from tensorgen.schedule.layout import lay_out
from tensorgen.schedule.state import State
from tensorgen.search.layouts import LAYOUT_TEMPLATES, Layouts
from tensorgen.task import SearchTask
from tensorgen.tuning.tune import MeasureConfig, TuneResult, tune


@dataclass(frozen=True)
class AltConfig:
    """layouts: candidates in the joint stage (the task's own included); joint_fraction: the share of the
    trials they get together; template: a name of search.layouts.LAYOUT_TEMPLATES."""

    layouts: int = 4
    joint_fraction: float = 0.5
    template: str = "tiling"

    def __post_init__(self) -> None:
        if self.layouts < 1 or not 0 < self.joint_fraction <= 1 or self.template not in LAYOUT_TEMPLATES:
            raise TuneError(f"bad ALT config {self}: need layouts >= 1, 0 < joint_fraction <= 1 and a template "
                            f"of {sorted(LAYOUT_TEMPLATES)}")


@dataclass(frozen=True)
class LayoutTrial:
    layouts: Layouts
    best_cost: float  # seconds; inf when nothing measured ran
    trials: int


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


def tune_alt(task: SearchTask, trials: int, *, db: str | Path | Database | None = None,
             config: AltConfig = AltConfig(), seed: int = 0, measure: MeasureConfig | None = None,
             batch_size: int = 16, policy_options: dict[str, Any] | None = None) -> AltResult:
    """Joint stage over `config.layouts` layouts, then the loop-only stage on the best (module docstring)."""
    if trials < 1:
        raise TuneError(f"tune_alt needs trials >= 1, got {trials}")
    t0, measure = time.perf_counter(), measure or MeasureConfig()
    candidates = layout_candidates(task, config.layouts, config.template, np.random.default_rng(seed))
    share = max(1, int(trials * config.joint_fraction) // len(candidates))
    runs: list[tuple[Layouts, SearchTask, TuneResult]] = []
    for layouts in candidates:
        variant = laid_out_task(task, layouts)
        result = tune(variant, share, db=db, seed=seed, measure=measure, batch_size=min(batch_size, share),
                      policy_options=policy_options)
        runs.append((layouts, variant, result))
    used = share * len(candidates)
    best_layouts, best_task, best = min(runs, key=lambda r: r[2].best_cost)
    if trials > used:
        best = tune(best_task, trials - used, db=db, seed=seed + 1, measure=measure, batch_size=batch_size,
                    policy_options=policy_options)
    state = None
    if best.best_state is not None:
        state = State(task.dag)
        for name, prims in best_layouts.items():
            state.transform_layout(name, prims)
        for step in best.best_state.steps:
            state.apply(step)
    explored = [LayoutTrial(layouts, r.best_cost, r.trials) for layouts, _, r in runs]
    return AltResult(task, best_layouts, state, best.best_cost, max(trials, used), time.perf_counter() - t0,
                     explored)
