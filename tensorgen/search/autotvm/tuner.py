"""AutoTVMPolicy: AutoTVM's model-based tuner (§3) over a template's configuration space, as a SearchPolicy.

The loop (Algorithm 1, as TVM's ModelBasedTuner runs it):

1. until the model has learned something, batches are random configs;
2. after each measured batch the model (`RankModel`: XGBoost with the pairwise rank objective over the configs'
   knob features) is retrained on every config measured so far, and simulated annealing (anneal.py) walks the
   space with the model's score to plan the `plan_size` best configs not yet measured or proposed;
3. a batch takes the plan in order, each slot with probability `eps_greedy` a random config instead.

The model reads the configs, not the programs: AutoTVM's "knob" features (space.ConfigSpace.features), so the
annealing scores thousands of configs without lowering one. Knob features mean nothing across tasks, so transfer
(§4) goes through the session's cost model instead, when it arrives trained — a model of other tasks' records over
Ansor's features of the lowered programs, which are the same for any task (`tune(cost_model="xgb:FILE")`, or an
XGBModel trained on `tuning.training.load_training_set(dbs).arrays()`): it is the paper's global model. Then each
plan is `transfer_pool` times as large, and its configs are ranked by the global model's score plus the local
one's (each standardized); before the first measurement, a pool of random configs ranked by the global model alone
makes the first batch. An untrained session model (the default) is not used. Records of this task replayed from a
database are never proposed again, but teach the local model nothing: they hold programs, not configs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorgen.costmodel.base import CostModel, normalize_throughput
from tensorgen.errors import TuneError
from tensorgen.features.extractor import FeatureExtractor
from tensorgen.measure.types import MeasureInput, MeasureResult
from tensorgen.schedule.state import State
from tensorgen.search.autotvm.anneal import AnnealConfig, Point, SimulatedAnnealing
from tensorgen.search.autotvm.space import SpaceBuilder
from tensorgen.search.autotvm.templates import template_for
from tensorgen.search.policy import SearchPolicy, state_key
from tensorgen.search.skips import Skips
from tensorgen.task import SearchTask

if TYPE_CHECKING:
    import xgboost as xgb


def standardized(scores: np.ndarray) -> np.ndarray:
    """Scores as z-scores (the scales of two models' outputs differ)."""
    std = float(scores.std())
    return (scores - scores.mean()) / (std if std > 0 else 1.0)


class RankModel:
    """XGBoost ranking configs by their knob features (AutoTVM's XGBoostCostModel with loss_type="rank"; its tree
    parameters, `num_rounds` boosting rounds instead of its early stopping). Random scores until trained."""

    def __init__(self, seed: int = 0, num_rounds: int = 100) -> None:
        self.num_rounds = num_rounds
        self.params = {"objective": "rank:pairwise", "max_depth": 3, "gamma": 0.0001, "min_child_weight": 1,
                       "eta": 0.3, "lambda": 1.0, "alpha": 0.0, "seed": seed, "nthread": 1, "verbosity": 0}
        self.rng = np.random.default_rng(seed)
        self.booster: xgb.Booster | None = None

    def fit(self, features: np.ndarray, y: np.ndarray) -> None:
        """Retrain from scratch on all of (features, y): y is higher for faster programs."""
        import xgboost as xgb  # here, not at the top: see tensorgen.costmodel.xgb

        self.booster = xgb.train(self.params, xgb.DMatrix(features, label=y), num_boost_round=self.num_rounds)

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self.booster is None:
            return self.rng.random(len(features))
        return np.asarray(self.booster.inplace_predict(features), dtype=np.float64)


@dataclass(frozen=True)
class AutoTVMConfig:
    """The tuner's knobs (AutoTVM's defaults): the template (a name of templates.TEMPLATES, or "auto"), how many
    configs each annealing plans, the eps-greedy share of random ones, the boosting rounds of the model and, with a
    global model, how many times the plan it reranks;
    `anneal` holds the annealing's (`AutoTVMConfig.of(chains=64, plan_size=32)` takes both in one flat set)."""

    template: str = "auto"
    plan_size: int = 64
    eps_greedy: float = 0.05
    num_rounds: int = 100
    transfer_pool: int = 4
    anneal: AnnealConfig = AnnealConfig()

    def __post_init__(self) -> None:
        if self.plan_size < 1 or not 0 <= self.eps_greedy <= 1 or self.num_rounds < 1 or self.transfer_pool < 1:
            raise TuneError(f"need plan_size >= 1, 0 <= eps_greedy <= 1, num_rounds >= 1 and transfer_pool >= 1; "
                            f"got {self}")

    @classmethod
    def of(cls, **knobs: Any) -> AutoTVMConfig:
        anneal_knobs = {f.name for f in fields(AnnealConfig)}
        own = {f.name for f in fields(cls)} - {"anneal"}
        unknown = sorted(set(knobs) - anneal_knobs - own)
        if unknown:
            raise TuneError(f"the autotvm policy has no knob {', '.join(map(repr, unknown))}; its knobs: "
                            f"{', '.join(sorted(own | anneal_knobs))}")
        anneal = replace(AnnealConfig(), **{k: v for k, v in knobs.items() if k in anneal_knobs})
        return cls(anneal=anneal, **{k: v for k, v in knobs.items() if k in own})


class AutoTVMPolicy(SearchPolicy):
    """AutoTVM's tuner for `task` on a CPU target (seeded: same seed and measurements, same batches)."""

    def __init__(self, task: SearchTask, seed: int = 0, config: AutoTVMConfig = AutoTVMConfig(),
                 skips: Skips | None = None, global_model: CostModel | None = None) -> None:
        if task.target.kind != "cpu":
            raise TuneError(f"the autotvm templates are CPU schedules; target {task.target} is not a CPU")
        self.task, self.seed, self.config = task, seed, config
        self.skips = skips if skips is not None else Skips()
        self.rng = np.random.default_rng(seed)
        self.template_name, self.template = template_for(task.dag, config.template)
        builder = SpaceBuilder()
        self.template.define(builder, task.dag)
        self.space = builder.space()
        self.anneal = SimulatedAnnealing(self.space, self.rng, config.anneal)
        self.model = RankModel(seed, config.num_rounds)
        self.visited: set[Point] = set()  # configs proposed or measured (or failed to apply)
        self.seen: set[str] = set()  # state keys proposed or measured, this session's and the database's
        self.point_of: dict[str, Point] = {}  # state key -> the config that made it
        self.xs: list[Point] = []  # measured configs and their throughputs (0: failed)
        self.ys: list[float] = []
        self.plan: list[Point] = []
        self.global_model = global_model if global_model is not None and global_model.trained else None
        if self.global_model is not None:
            self.extractor = FeatureExtractor(task.hw, dataflow=self.global_model.dataflow)
            self.replan()

    @classmethod
    def from_options(cls, task: SearchTask, cost_model: CostModel | None = None, seed: int = 0,
                     skips: Skips | None = None, **knobs: Any) -> AutoTVMPolicy:
        """The policy with its knobs given flat (AutoTVMConfig.of), as `tune(policy_options=...)` passes them;
        `cost_model`, if trained, is the global model of transfer (the module docstring says how)."""
        return cls(task, seed, AutoTVMConfig.of(**knobs), skips, cost_model)

    # ---- proposing --------------------------------------------------------------------------

    def next_batch(self, n: int) -> list[State]:
        out: list[State] = []
        misses = 0  # random draws in a row that hit a visited config: the space is (nearly) exhausted
        while len(out) < n and len(self.visited) < self.space.size and misses < 100:
            if self.plan and self.rng.random() >= self.config.eps_greedy:
                point = self.plan.pop(0)
            else:
                point = tuple(self.space.random(self.rng, 1)[0].tolist())
            if point in self.visited:
                misses += 1
                continue
            misses = 0
            self.visited.add(point)
            state = self.apply(point)
            key = state_key(state) if state is not None else None
            if key is not None and key not in self.seen:
                self.seen.add(key)
                self.point_of[key] = point
                out.append(state)
        return out

    def apply(self, point: Point) -> State | None:
        """The template's program of config `point`; None if the template fails on it (counted in skips, the first
        failure logged)."""
        state = None
        with self.skips.guard("autotvm template", f"template {self.template_name}"):
            state = self.template.apply(self.task.dag, self.space.config(self.space.index(point)))
        return state

    # ---- learning ---------------------------------------------------------------------------

    def update(self, inputs: list[MeasureInput], results: list[MeasureResult]) -> None:
        """Record the measured configs, retrain the model on all of them and plan the next configs."""
        if len(inputs) != len(results):
            raise ValueError(f"{len(inputs)} inputs but {len(results)} results")
        flop = self.task.dag.flop_count
        for inp, res in zip(inputs, results):
            key = state_key(inp.state)
            self.seen.add(key)
            point = self.point_of.get(key)
            if point is None:  # a record from the database: not made from a config this session knows
                continue
            cost = res.median_cost if res.ok else math.inf
            self.xs.append(point)
            self.ys.append(flop / cost if math.isfinite(cost) and cost > 0 else 0.0)
        if not any(y > 0 for y in self.ys):
            return
        with self.skips.guard("autotvm model update", str(self.task)):
            self.model.fit(self.space.features(np.array(self.xs)), normalize_throughput(np.array(self.ys)))
            self.replan()

    def replan(self) -> None:
        """The next configs to measure: the annealing's best by the local model; with a global model, a pool of
        `transfer_pool` times as many (random configs while the local model has learned nothing) reranked by the
        sum of both models' standardized scores."""
        trained = self.model.booster is not None
        size = self.config.plan_size * (self.config.transfer_pool if self.global_model is not None else 1)
        if trained:
            pool = self.anneal.search(lambda p: self.model.predict(self.space.features(p)), size, self.visited)
        else:
            pool = list(dict.fromkeys(p for p in map(tuple, self.space.random(self.rng, size).tolist())
                                      if p not in self.visited))
        if self.global_model is not None:
            made = [(p, s) for p in pool if (s := self.apply(p)) is not None]
            if not made:
                self.plan = []
                return
            score = standardized(self.global_model.predict(self.extractor.extract([s for _, s in made])))
            if trained:
                score += standardized(self.model.predict(self.space.features(np.array([p for p, _ in made]))))
            pool = [made[int(i)][0] for i in np.argsort(-score, kind="stable")]
        self.plan = pool[: self.config.plan_size]

    def __repr__(self) -> str:
        return (f"AutoTVMPolicy({self.task}, template {self.template_name}, space {self.space.size}, "
                f"{len(self.xs)} measured, {len(self.visited)} visited)")
