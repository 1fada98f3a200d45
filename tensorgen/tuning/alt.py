"""ALT's joint layout and loop tuning of one task (§5): `tune` with the ALT search policy (search.alt_policy).

`tune_alt(task, trials, config=AltConfig(...))` gives the joint stage `joint_fraction` of the trials over
`config.layouts` layouts (the task's own without a lead: the budget is known) and the loop-only stage the rest;
the records are the task's own (layout steps, then
loops). In a model, name the policy instead: `TaskScheduler.tune(..., policy="alt")`, `tensorgen tune --policy alt`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorgen.dag import ComputeDAG
from tensorgen.errors import TuneError
from tensorgen.records.database import Database
from tensorgen.schedule.state import State, state_layouts
from tensorgen.search.alt_policy import EXPLORATIONS, AltPolicy, LayoutTrial
from tensorgen.search.layouts import LAYOUT_TEMPLATES, Layouts
from tensorgen.target import Target
from tensorgen.task import SearchTask
from tensorgen.te.tensor import Tensor
from tensorgen.tuning.tune import MeasureConfig, make_cost_model, make_task, tune


@dataclass(frozen=True)
class AltConfig:
    """layouts: candidates in the joint stage (the task's own included); joint_fraction: the share of the
    trials they get together; template: a name of search.layouts.LAYOUT_TEMPLATES; exploration: how the joint
    budget is spread over the layouts (search.alt_policy.EXPLORATIONS)."""

    layouts: int = 4
    joint_fraction: float = 0.5
    template: str = "tiling"
    exploration: str = "uniform"  # or "halving", "evolve" (bench/results/alt_explorations_s21.md)

    def __post_init__(self) -> None:
        if self.layouts < 1 or not 0 < self.joint_fraction <= 1 or self.template not in LAYOUT_TEMPLATES \
                or self.exploration not in EXPLORATIONS:
            raise TuneError(f"bad ALT config {self}: need layouts >= 1, 0 < joint_fraction <= 1, a template of "
                            f"{sorted(LAYOUT_TEMPLATES)} and an exploration of {EXPLORATIONS}")


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


def tune_alt(task_or_dag: SearchTask | ComputeDAG | Tensor | Sequence[Tensor], trials: int, *,
             db: str | Path | Database | None = None, target: str | Target = "cpu",
             config: AltConfig = AltConfig(), seed: int = 0, measure: MeasureConfig | None = None,
             batch_size: int = 16, policy_options: dict[str, Any] | None = None) -> AltResult:
    """`trials` of ALT's search on one task (module docstring); `policy_options` are SketchPolicy's, for the
    search of every layout's loops."""
    task = make_task(task_or_dag, target)
    if trials < 1:
        raise TuneError(f"tune_alt needs trials >= 1, got {trials}")
    t0 = time.perf_counter()
    policy = AltPolicy(task, make_cost_model("xgb", seed), seed, layouts=config.layouts,
                       joint_trials=int(trials * config.joint_fraction), template=config.template,
                       exploration=config.exploration, **{"own_lead": 0, **(policy_options or {})})
    try:
        result = tune(task, trials, db=db, policy=policy, measure=measure or MeasureConfig(), batch_size=batch_size,
                      seed=seed)
    finally:
        policy.close()
    layouts = state_layouts(result.best_state) if result.best_state is not None else {}
    return AltResult(task, layouts, result.best_state, result.best_cost, result.trials,
                     time.perf_counter() - t0, policy.explored())
