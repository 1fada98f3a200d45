"""What the task scheduler minimizes and how it estimates progress: the objective functions over the per-task
latency vector (Ansor Table 2) and the pieces of the gradient approximation (§6.2, Appendix A).

An objective is any callable `f(latencies, view) -> float` (lower is better), where `latencies[i]` is
task i's best latency in seconds — always finite: the scheduler puts an estimate in for tasks without a
valid measurement — and `view` is what the scheduler knows (models, weights, per-task history). The
scheduler only needs f's values: it differentiates f numerically (`objective_gradient`), so a user's
objective needs no gradient of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.dag import ComputeDAG
from tensorgen.errors import TensorgenError


class SchedulerError(TensorgenError, ValueError):
    """The task scheduler was given arguments it cannot use (bad weights, unknown model, ...)."""


@dataclass(frozen=True)
class SchedulerView:
    """The scheduler's knowledge an objective may use.

    `weights[j, i]` is how many times task i runs in one inference of model `models[j]` (0: not in it);
    `history[i][r]` is task i's best latency (s, inf until a success) after its (r+1)-th round;
    `latencies` is the point the scheduler evaluates the objective at: the current bests, with an estimate
    for tasks that have none yet (see `estimate_latencies` in tensorgen.tuning.scheduler).
    """

    models: tuple[str, ...]
    weights: np.ndarray
    history: tuple[tuple[float, ...], ...]
    latencies: np.ndarray

    def model_latencies(self, latencies: np.ndarray) -> np.ndarray:
        """Sum of weight x latency per model (latencies must be finite: 0 x inf is not 0)."""
        return self.weights @ latencies


Objective = Callable[[np.ndarray, SchedulerView], float]


def per_model(values: Sequence[float] | Mapping[str, float], view: SchedulerView, what: str) -> np.ndarray:
    """One value per model, in model order, from a sequence or a {model name: value} mapping."""
    if isinstance(values, Mapping):
        missing = [m for m in view.models if m not in values]
        if missing:
            raise SchedulerError(f"{what}: no value for model(s) {', '.join(map(repr, missing))}")
        out = [values[m] for m in view.models]
    else:
        out = list(values)
        if len(out) != len(view.models):
            raise SchedulerError(f"{what}: {len(out)} values for {len(view.models)} model(s) {list(view.models)}")
    arr = np.asarray(out, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise SchedulerError(f"{what}: values must be positive seconds, got {out}")
    return arr


def stalled(history: Sequence[float], rounds: int) -> bool:
    """No improvement of the best latency in the last `rounds` rounds (needs rounds + 1 of history)."""
    return rounds > 0 and len(history) > rounds and not history[-1] < history[-1 - rounds]


@dataclass(frozen=True)
class TotalLatency:
    """f1: the summed end-to-end latency of all models (a pipeline that runs each model once)."""

    def __call__(self, latencies: np.ndarray, view: SchedulerView) -> float:
        return float(np.sum(view.model_latencies(latencies)))


@dataclass(frozen=True)
class LatencyRequirements:
    """f2: like f1, but a model that meets its latency requirement (seconds) gains nothing from more tuning."""

    requirements: Sequence[float] | Mapping[str, float]

    def __call__(self, latencies: np.ndarray, view: SchedulerView) -> float:
        limits = per_model(self.requirements, view, "LatencyRequirements")
        return float(np.sum(np.maximum(view.model_latencies(latencies), limits)))


@dataclass(frozen=True)
class GeoMeanSpeedup:
    """f3: minus the geometric mean over models of the speedup against reference latencies (seconds)."""

    references: Sequence[float] | Mapping[str, float]

    def __call__(self, latencies: np.ndarray, view: SchedulerView) -> float:
        refs = per_model(self.references, view, "GeoMeanSpeedup")
        totals = view.model_latencies(latencies)
        if np.any(totals <= 0):
            return -math.inf
        return -float(np.exp(np.mean(np.log(refs) - np.log(totals))))


@dataclass(frozen=True)
class EarlyStopping:
    """f4: f1 where a task that has not improved in its last `rounds` rounds is held at its current best
    (ES(g_i, t) = g_i), so lowering it gains nothing and the gradient scheduler stops allocating to it."""

    rounds: int

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise SchedulerError(f"EarlyStopping needs rounds >= 1, got {self.rounds}")

    def __call__(self, latencies: np.ndarray, view: SchedulerView) -> float:
        stop = np.array([stalled(h, self.rounds) for h in view.history], dtype=bool)
        floor = np.where(stop, view.latencies, 0.0)
        return float(np.sum(view.model_latencies(np.maximum(latencies, floor))))


# ---------------------------------------------------------------------------------------------
# the pieces of the gradient (Ansor Appendix A)


def similarity_tag(dag: ComputeDAG) -> str:
    """The tags of the DAG's compute-intensive stages (data reuse: Ansor's multi-level-tiling test), e.g.
    "conv2d"; "" when it has none (element-wise tasks are similar to nothing)."""
    return "+".join(t.tag or "reuse" for t in dag.compute_tensors if dag.has_data_reuse(t.name))


def similar_tasks(tags: Sequence[str], flops: Sequence[float], factor: float) -> list[tuple[int, ...]]:
    """N(i) for every task: those with the same non-empty tag and FLOPs within `factor` of each other."""
    def close(a: float, b: float) -> bool:
        return a > 0 and b > 0 and max(a, b) <= factor * min(a, b)

    return [tuple(k for k in range(len(tags)) if tag and tags[k] == tag and close(flops[i], flops[k]))
            for i, tag in enumerate(tags)]


def estimate_latencies(best: np.ndarray, flops: np.ndarray) -> np.ndarray:
    """`best` with a pessimistic stand-in for tasks without a valid measurement (inf): their FLOPs at the
    lowest FLOP/s any task reached, else the largest latency known, else 1 s. A failing task so keeps a
    fair share of rounds without dominating the objective (or making it inf)."""
    ok = np.isfinite(best)
    if ok.all():
        return best.astype(np.float64)
    speeds = [f / g for f, g in zip(flops[ok], best[ok]) if f > 0 and g > 0]
    fallback = float(best[ok].max()) if ok.any() else 1.0
    stand_in = [f / min(speeds) if speeds and f > 0 else fallback for f in flops]
    return np.where(ok, best, stand_in).astype(np.float64)


def task_gradient(df_dg: float, history: Sequence[float], latency: float, flops: float, similar_speed: float,
                  alpha: float, beta: float, window: int) -> float:
    """Ansor's approximation of df/dt_i for one task with t_i = len(history) rounds and current (estimated)
    latency g_i = `latency`; `similar_speed` is max V_k over N(i) (0: none known). The backward term needs
    window + 1 rounds of finite history, else it is 0."""
    t = len(history)
    backward = 0.0
    if t > window and math.isfinite(history[-1]) and math.isfinite(history[-1 - window]):
        backward = (history[-1] - history[-1 - window]) / window
    forward = -latency / t
    if similar_speed > 0 and flops > 0:
        forward = min(forward, beta * flops / similar_speed - latency)
    return df_dg * (alpha * backward + (1 - alpha) * forward)


def objective_gradient(objective: Objective, latencies: np.ndarray, view: SchedulerView,
                       rel_step: float = 1e-3) -> np.ndarray:
    """df/dg_i by a backward difference (f(g) - f(g - d e_i)) / d with d relative to g_i: the direction tuning
    moves a latency in, so a kink such as f2's max() reads as 0 once a model meets its requirement."""
    base = objective(latencies, view)
    grad = np.zeros(len(latencies))
    for i, g in enumerate(latencies):
        step = rel_step * g if g > 0 else 1e-12
        lowered = latencies.copy()
        lowered[i] = g - step
        grad[i] = (base - objective(lowered, view)) / step
    return grad
