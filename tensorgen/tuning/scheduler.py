"""TaskScheduler: spend one tuning budget on the tasks (subgraphs) of one or more models (Ansor §6).

Time is allocated in rounds of one measurement batch. After a warm-up round robin (every task gets one
round) each round goes to the task whose allocation lowers the objective fastest, by the gradient
approximation of Ansor §6.2 / Appendix A:

    df/dt_i ~ df/dg_i * (alpha * (g_i(t_i) - g_i(t_i - dt)) / dt
                         + (1 - alpha) * min(-g_i(t_i) / t_i, beta * C_i / max_{k in N(i)} V_k - g_i(t_i)))

with g_i task i's best latency, t_i its rounds, C_i its FLOPs, V_k the best FLOP/s of the similar tasks
N(i) (same compute-intensive stage tags, FLOPs within `similarity_factor`), and an eps-greedy random pick.
One deviation: a task whose best has not improved in `similarity_patience` rounds loses its similarity
term. A structurally slower task (ResNet-50's stride-2 1x1 projection next to its 1x1 peers) otherwise
keeps a large predicted gain forever: it took 208 of 1024 trials and stayed at 40% of its peers' speed.
"round-robin" allocates evenly instead (the "no task scheduler" ablation of Figure 10).

The scheduler measures nothing itself: it drives one `RoundTuner` per task (`tensorgen.tuning.tune.TaskTuner`,
which keeps its policy and cost model alive between rounds). Everything it knows comes from their
measured costs, so a run over a database that already holds records resumes where the last one stopped.
"""

from __future__ import annotations

import logging
import math
import numbers
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tensorgen.records.database import Database
from tensorgen.registry import Registry
from tensorgen.schedule.state import State
from tensorgen.search.policy import SearchPolicy
from tensorgen.search.skips import Skips
from tensorgen.search.transfer import transfer_candidates
from tensorgen.task import SearchTask
from tensorgen.tuning.objectives import (
    Objective,
    SchedulerError,
    SchedulerView,
    TotalLatency,
    estimate_latencies,
    objective_gradient,
    similar_tasks,
    similarity_tag,
    stalled,
    task_gradient,
)
from tensorgen.tuning.progress import (
    ProgressTable,
    SchedulerCallback,
    ScheduleResult,
    SchedulerProgress,
    StopTuning,
    TaskRow,
    shows_progress,
)
from tensorgen.tuning.runinfo import model_run
from tensorgen.tuning.tune import MeasureConfig, MeasureSetup, TaskTuner, make_cost_model, make_policy

LOGGER = logging.getLogger("tensorgen.scheduler")

#: How TaskScheduler.tune measures by default: a model's tasks are timed with their weights evicted.
MODEL_MEASURE = MeasureConfig(runner_options={"evict_weights": True})

__all__ = ["MODEL_MEASURE", "STRATEGIES", "ModelTasks", "RoundTuner", "SchedulerConfig", "SchedulerError",
           "TaskScheduler"]


class RoundTuner(Protocol):
    """What the scheduler drives per task (tensorgen.tuning.tune.TaskTuner; tests use fakes). Subclass it to inherit
    the defaults of `offer` and `release`."""

    task: SearchTask
    best_state: State | None

    costs: Sequence[float]  # every program's first measured cost (s, inf: failed), the database's first, in order
    best_cost: float  # the best program's cost (s, inf: none), over all its measurements (re-timings included)

    def resume(self) -> object:
        """Load what the database knows (called once, first)."""
        ...

    def round(self, n_trials: int) -> int:
        """Measure up to n_trials new programs; return how many (0: nothing new to measure)."""
        ...

    def confirm(self) -> int:
        """Re-time the best program if it was measured fewer times than a best needs; return how many times."""
        ...

    def remeasure(self) -> int:
        """Measure the best program once more, now; return how many times (the default: never, 0)."""
        return 0

    def offer(self, states: Sequence[State]) -> None:
        """Programs adapted from similar tasks, before a round (see SearchPolicy.offer); the default ignores them."""

    def release(self) -> None:
        """After its round: free what the tuner holds until its next one (worker processes). Default: nothing."""

    def seconds(self) -> tuple[float, float, float]:
        """(search, build, run) seconds this tuner has spent so far; the default: not counted, (0, 0, 0)."""
        return 0.0, 0.0, 0.0


@dataclass(frozen=True)
class ModelTasks:
    """One model: indices into the scheduler's tasks and how many times each runs per inference."""

    name: str
    task_indices: tuple[int, ...]
    weights: tuple[float, ...]




# ---------------------------------------------------------------------------------------------
# allocation strategies: (scheduler, session, tasks still open) -> task to tune next, None: stop


def _round_robin(sched: TaskScheduler, session: _Session, open_tasks: list[int]) -> int | None:
    return min(open_tasks, key=lambda i: (len(session.history[i]), i))


def _gradient(sched: TaskScheduler, session: _Session, open_tasks: list[int]) -> int | None:
    grads = sched.gradients(session.history)[open_tasks]
    if not np.any(grads < 0):  # nothing left to gain under this objective
        return None
    if session.rng.random() < sched.config.eps_greedy:
        return int(session.rng.choice(open_tasks))
    ties = [i for i, g in zip(open_tasks, grads) if g == grads.min()]
    return ties[0] if len(ties) == 1 else int(session.rng.choice(ties))


#: How the scheduler picks the next task: strategy(scheduler, session, open task indices) -> a task or None (no task
#: is worth a round). Register your own with STRATEGIES.register(name, function).
STRATEGIES: Registry[int | None] = Registry("strategy", SchedulerError)
STRATEGIES.register("gradient", _gradient)
STRATEGIES.register("round-robin", _round_robin)


def _history_of(costs: Sequence[float], round_trials: int) -> list[float]:
    """Best latency after each round, for costs measured before (records chunked into rounds)."""
    best, out = math.inf, []
    for n, cost in enumerate(costs, 1):
        best = min(best, cost)
        if n % round_trials == 0 or n == len(costs):
            out.append(best)
    return out


@dataclass
class _Session:
    """The mutable state of one run()."""

    tuners: Sequence[RoundTuner]
    history: list[list[float]]
    rng: np.random.Generator
    trials: int
    start: float = field(default_factory=time.perf_counter)
    done: int = 0
    rounds: int = 0
    dead: set[int] = field(default_factory=set)  # tasks whose policy proposed nothing new
    offered: dict[int, dict[int, float]] = field(default_factory=dict)  # task -> {donor task: its best then}
    callbacks: tuple[SchedulerCallback, ...] = ()  # the scheduler's and this run's

    def best(self) -> np.ndarray:
        return np.array([h[-1] if h else math.inf for h in self.history])


@dataclass(frozen=True)
class SchedulerConfig:
    """The knobs of the task scheduler (Ansor's defaults, see the module docstring).

    `strategy` is a name of STRATEGIES ("gradient", "round-robin"); each round measures `round_trials`
    programs of one task, except each task's first (the warm-up), which measures `warmup_trials` (None: as many):
    a model has an estimate once every task has its first round, and a search that starts warm (a pretrained cost
    model) needs fewer programs to find a good first one. `alpha`, `beta`, `backward_window` and `eps_greedy` are
    the gradient's (Ansor §6.2); tasks of the same stage tags whose FLOPs are within `similarity_factor` are
    similar, and a task whose best has not improved in `similarity_patience` rounds (None: never) loses its
    similarity term.
    `early_stopping` (rounds): a task whose best has not improved in that many of its rounds gets no more.
    `transfer`: before a round, the task's policy is offered the best programs of tasks of the same structure
    whose best changed since (tensorgen.search.transfer), adapted to its shapes; False is Ansor as published.
    """

    strategy: str = "gradient"
    round_trials: int = 64
    warmup_trials: int | None = None
    alpha: float = 0.2
    beta: float = 2.0
    backward_window: int = 3
    eps_greedy: float = 0.05
    similarity_factor: float = 2.0
    similarity_patience: int | None = 3
    early_stopping: int | None = None
    transfer: bool = True

    def __post_init__(self) -> None:
        STRATEGIES.get(self.strategy)  # an unknown name is an error here, not at the first pick
        if not (0 <= self.alpha <= 1 and self.beta > 0 and self.backward_window >= 1
                and 0 <= self.eps_greedy <= 1 and self.round_trials >= 1 and self.similarity_factor >= 1
                and (self.warmup_trials is None or self.warmup_trials >= 1)
                and (self.early_stopping is None or self.early_stopping >= 1)
                and (self.similarity_patience is None or self.similarity_patience >= 1)):
            raise SchedulerError(
                f"need 0 <= alpha <= 1, beta > 0, backward_window >= 1, 0 <= eps_greedy <= 1, round_trials >= 1, "
                f"similarity_factor >= 1, warmup_trials, early_stopping and similarity_patience None or >= 1; "
                f"got {self}")


class TaskScheduler:
    """Allocates rounds of `config.round_trials` measurements to `tasks` so as to minimize `objective`.

    `weights` are the models: None (one model, every task once), a list of per-task weights (one model),
    or ModelTasks (several models tuned at once; a task several models share is tuned once for all).
    `objective` is any `f(latencies, view) -> float` (tensorgen.tuning.objectives; default TotalLatency, f1).
    `config` holds the knobs (SchedulerConfig); `seed` seeds the picks and the policies the scheduler makes.
    """

    def __init__(self, tasks: Sequence[SearchTask], weights: Sequence[float] | Sequence[ModelTasks] | None = None, *,
                 objective: Objective | None = None, config: SchedulerConfig = SchedulerConfig(), seed: int = 0,
                 callbacks: Sequence[SchedulerCallback] = ()) -> None:
        self.tasks = list(tasks)
        if not self.tasks:
            raise SchedulerError("TaskScheduler needs at least one task")
        _check_distinct(self.tasks)
        self.config, self.seed = config, seed
        self.models = _models(weights, len(self.tasks))
        self.weights = np.zeros((len(self.models), len(self.tasks)))
        for j, m in enumerate(self.models):
            np.add.at(self.weights[j], list(m.task_indices), list(m.weights))
        self.objective: Objective = objective if objective is not None else TotalLatency()
        self.callbacks = tuple(callbacks)
        self.flops = np.array([t.dag.flop_count for t in self.tasks], dtype=np.float64)
        self.similar = similar_tasks([similarity_tag(t.dag) for t in self.tasks], self.flops,
                                    config.similarity_factor)
        self._check_objective()

    @classmethod
    def from_models(cls, models: Mapping[str, Sequence[Any]], **options: Any) -> TaskScheduler:
        """A scheduler for several models given as {name: [(task, weight), ...]} (or items with `.task` and
        `.weight`, as tensorgen.graph.backend.tasks.extract_tasks returns): tasks with the same workload and target are
        merged into one (tuned once, weighted in every model that has it)."""
        tasks: list[SearchTask] = []
        index: dict[str, int] = {}
        specs = []
        for name, items in models.items():
            indices, weights = [], []
            for item in items:
                try:
                    task, weight = (item.task, item.weight) if hasattr(item, "task") else item
                except (TypeError, ValueError):
                    raise SchedulerError(f"model {name!r}: expected (task, weight) items, got {item!r}") from None
                if not isinstance(task, SearchTask):
                    raise SchedulerError(f"model {name!r}: {task!r} is not a SearchTask")
                if task.key not in index:
                    index[task.key] = len(tasks)
                    tasks.append(task)
                indices.append(index[task.key])
                weights.append(weight)
            specs.append(ModelTasks(name, tuple(indices), tuple(weights)))
        return cls(tasks, specs, **options)

    # ---- the gradient ---------------------------------------------------------------------------

    def view(self, history: Sequence[Sequence[float]]) -> SchedulerView:
        """What objectives see, at the current bests (estimated where there are none)."""
        best = np.array([h[-1] if h else math.inf for h in history])
        return SchedulerView(tuple(m.name for m in self.models), self.weights, tuple(tuple(h) for h in history),
                             estimate_latencies(best, self.flops))

    def gradients(self, history: Sequence[Sequence[float]]) -> np.ndarray:
        """df/dt_i for every task (0 for a task without rounds: it has no estimate). A task without a valid
        measurement gets no similarity term: its stand-in latency is itself made from other tasks' speeds,
        and a peer's speed it cannot approach would keep it first forever; nor does a stalled task (see the
        module docstring)."""
        view = self.view(history)
        df_dg = objective_gradient(self.objective, view.latencies, view)
        out = np.zeros(len(self.tasks))
        for i, h in enumerate(history):
            if not h:
                continue
            patience = self.config.similarity_patience
            peers = self.similar[i] if math.isfinite(h[-1]) and not (patience and stalled(h, patience)) else ()
            speeds = [self.flops[k] / history[k][-1] for k in peers if 0 < history[k][-1] < math.inf]
            out[i] = task_gradient(df_dg[i], h, view.latencies[i], self.flops[i], max(speeds, default=0.0),
                                   self.config.alpha, self.config.beta, self.config.backward_window)
        return out

    def _check_objective(self) -> None:
        """Evaluate the objective once now, so a bad one fails before any tuning."""
        view = self.view([[1.0] for _ in self.tasks])
        value = self.objective(view.latencies, view)
        try:
            ok = not math.isnan(float(value))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise SchedulerError(f"the objective {self.objective!r} must return a number, got {value!r}")

    # ---- running --------------------------------------------------------------------------------

    def tune(self, trials: int, *, db: str | Path | Database | None = None,
             policy: str | Callable[[SearchTask], SearchPolicy] = "ansor", cost_model: Any = "auto",
             policy_options: dict[str, Any] | None = None, measure: MeasureConfig | None = None,
             progress: bool | None = None) -> ScheduleResult:
        """Measure up to `trials` new programs over all tasks with one builder, runner and database (see
        tensorgen.tuning.tune.MeasureSetup.open) and return the best program of each task. `policy` is a name
        ("ansor": one SketchPolicy per task, all sharing one `cost_model`, as in Ansor; "random") or a
        function making a fresh SearchPolicy for a task.

        The default `measure` (MODEL_MEASURE) evicts each candidate's weights before every timed call: in a
        model they come from memory, since all the other kernels' weights were read in between. Timed hot,
        ResNet-50's deep convs ran 1.4x slower in the model than measured and the tuner favoured programs that
        only win hot.

        `progress` shows the live table on stderr (ProgressTable, as `tensorgen tune MODEL` does) besides the
        scheduler's callbacks: None where stderr is a terminal, True always, False never."""
        if not isinstance(policy, str) and not callable(policy):
            raise SchedulerError("the scheduler needs one policy per task: pass a policy name or a function "
                                 "task -> SearchPolicy, not a SearchPolicy instance")
        shared_model = make_cost_model(cost_model, self.seed, self.tasks[0].target if self.tasks else None, policy)
        skips = Skips()

        def timed(i: int, task: SearchTask) -> tuple[SearchPolicy, float]:
            t0 = time.perf_counter()
            made = policy(task) if callable(policy) else make_policy(task, policy, shared_model, self.seed + i,
                                                                     policy_options, skips)
            return made, time.perf_counter() - t0

        policies = [timed(i, task) for i, task in enumerate(self.tasks)]  # before the db: bad options make no file
        shown = [ProgressTable(sys.stderr)] if shows_progress(progress) else []
        with MeasureSetup.open(db, measure if measure is not None else MODEL_MEASURE) as setup:
            tuners = [TaskTuner(task, p, setup, search_s=s, skips=skips) for task, (p, s) in zip(self.tasks, policies)]
            models = {m.name: [(self.tasks[i].workload_key, w) for i, w in zip(m.task_indices, m.weights)]
                      for m in self.models}
            setup.begin_run(model_run(self.tasks, models, trials, policy, self.config.strategy))
            result = replace(self.run(tuners, trials, skips, shown), busy=setup.watch.seen)
            for table in shown:
                table.close()
            setup.end_run({"trials": result.trials, "rounds": result.rounds, "stopped": result.stopped})
            return result

    def run(self, tuners: Sequence[RoundTuner], trials: int, skips: Skips | None = None,
            callbacks: Sequence[SchedulerCallback] = ()) -> ScheduleResult:
        """Allocate up to `trials` measurements (this call's budget) to `tuners`, one per task, in order; `skips`
        (the tuners' failed search operations) goes into the result; `callbacks` see this run's progress after
        the scheduler's own."""
        if trials < 0 or len(tuners) != len(self.tasks):
            raise SchedulerError(f"need trials >= 0 and one tuner per task ({len(self.tasks)}); got trials={trials}, "
                                 f"{len(tuners)} tuners")
        session = _Session(tuners, [[] for _ in tuners], np.random.default_rng(self.seed), trials,
                           callbacks=(*self.callbacks, *callbacks))
        stopped = "budget"
        try:
            for tuner in tuners:
                tuner.resume()
            session.history = [_history_of(t.costs, self.config.round_trials) for t in tuners]
            for h, t in zip(session.history, tuners):
                if h:
                    h[-1] = t.best_cost  # over all measurements: a re-timed best may cost more than its first
            self._report(session, "resume", None, 0)
            while session.done < trials:
                i = self._pick(session)
                if i is None:
                    stopped = "exhausted" if not self._open_tasks(session) else "converged"
                    break
                if self.config.transfer:
                    self._offer_transfers(session, i)
                size = self.config.round_trials if session.history[i] or self.config.warmup_trials is None \
                    else self.config.warmup_trials
                if self.flops[i] == 0 and len(session.history[i]) == 1 and tuners[i].remeasure():  # see _pick
                    session.history[i][-1] = tuners[i].best_cost
                measured = tuners[i].round(min(size, trials - session.done))
                tuners[i].release()  # a model has dozens of tasks: keep only one task's workers alive
                if not measured:
                    LOGGER.info("%s: no new program to measure; the scheduler drops it", self.tasks[i])
                    session.dead.add(i)
                    continue
                session.done += measured
                session.rounds += 1
                session.history[i].append(tuners[i].best_cost)
                self._report(session, "round", i, measured)
            self._confirm(session)
        except StopTuning:
            stopped = "callback"
        except KeyboardInterrupt:
            stopped = "interrupted"
            LOGGER.info("scheduler interrupted after %d trials; every measured record is in the database",
                        session.done)
        search_s, build_s, run_s = np.sum([t.seconds() for t in tuners], axis=0)
        return ScheduleResult(self.tasks, self._rows(session), [t.best_state for t in tuners],
                              self._model_latencies(session.best()), session.done, session.rounds, stopped,
                              time.perf_counter() - session.start, skips.summary() if skips is not None else {},
                              float(search_s), float(build_s), float(run_s))

    def _confirm(self, session: _Session) -> None:
        """Before the final estimate: every task's best is re-timed unless it was already (see tune.RETIMES)."""
        retimed = 0
        for i, tuner in enumerate(session.tuners):
            if (n := tuner.confirm()) and session.history[i]:
                session.history[i][-1] = tuner.best_cost
            retimed += n
        if retimed:
            self._report(session, "confirm", None, retimed)

    def _offer_transfers(self, session: _Session, i: int) -> None:
        """Offer task i the adapted best programs of the other tasks whose best is new to it."""
        seen = session.offered.setdefault(i, {})
        donors = []
        for k, (tuner, best) in enumerate(zip(session.tuners, session.best())):
            if k != i and tuner.best_state is not None and math.isfinite(best) and seen.get(k) != best:
                seen[k] = best
                donors.append((tuner.best_state, self.flops[k] / best))
        if donors:
            limit = max(self.config.round_trials // 2, 1)
            session.tuners[i].offer(transfer_candidates(self.tasks[i].dag, donors, limit=limit))

    def _open_tasks(self, session: _Session) -> list[int]:
        stop = self.config.early_stopping
        return [i for i, h in enumerate(session.history)
                if i not in session.dead and not (stop is not None and stalled(h, stop))]

    def _pick(self, session: _Session) -> int | None:
        """Warm-up first (tasks without a round, in order), then a second round for each task without FLOPs, which
        begins by measuring its best once more (a transpose: its times are a few microseconds, the ones a busy moment
        disturbs most, and its first round timed them all in one stretch), then the strategy."""
        open_tasks = self._open_tasks(session)
        if not open_tasks:
            return None
        fresh = [i for i in open_tasks if not session.history[i]]
        fresh = fresh or [i for i in open_tasks if self.flops[i] == 0 and len(session.history[i]) == 1]
        return fresh[0] if fresh else STRATEGIES.get(self.config.strategy)(self, session, open_tasks)

    # ---- reporting ------------------------------------------------------------------------------

    def _rows(self, session: _Session) -> tuple[TaskRow, ...]:
        best = session.best()
        return tuple(TaskRow(i, t.desc or t.workload_key, float(self.flops[i]), float(self.weights[:, i].sum()),
                             float(best[i]), len(session.tuners[i].costs), len(session.history[i]))
                     for i, t in enumerate(self.tasks))

    def _model_latencies(self, best: np.ndarray) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for j, m in enumerate(self.models):
            used = self.weights[j] > 0
            out[m.name] = float(self.weights[j][used] @ best[used]) if np.isfinite(best[used]).all() else None
        return out

    def _report(self, session: _Session, phase: str, task: int | None, measured: int) -> None:
        if not session.callbacks:
            return
        best = session.best()
        objective = None
        if np.isfinite(best).all():
            objective = float(self.objective(best, self.view(session.history)))
        progress = SchedulerProgress(phase, session.rounds, task, measured, session.done, session.trials,
                                     self._rows(session), self._model_latencies(best), objective,
                                     time.perf_counter() - session.start)
        for cb in session.callbacks:
            cb(progress)


def _models(weights: Sequence[float] | Sequence[ModelTasks] | None, n: int) -> tuple[ModelTasks, ...]:
    """The models, checked: indices in range, one non-negative finite weight each, distinct names."""
    if weights is None:
        weights = [1.0] * n
    items = list(weights)
    if items and not all(isinstance(m, ModelTasks) for m in items):
        if any(isinstance(m, ModelTasks) for m in items) or len(items) != n:
            raise SchedulerError(f"weights must be {n} numbers (one model) or a list of ModelTasks, got {weights!r}")
        items = [ModelTasks("model", tuple(range(n)), tuple(items))]  # type: ignore[arg-type]
    if not items:
        raise SchedulerError("need at least one model")
    names = [m.name for m in items]
    if len(set(names)) != len(names):
        raise SchedulerError(f"model names must be distinct, got {names}")
    for m in items:
        in_range = all(isinstance(i, numbers.Integral) and 0 <= i < n for i in m.task_indices)
        if len(m.task_indices) != len(m.weights) or not in_range:
            raise SchedulerError(f"model {m.name!r}: need one weight per task index, indices in [0, {n}); "
                                 f"got indices {m.task_indices}, weights {m.weights}")
        if not all(isinstance(w, numbers.Real) and math.isfinite(w) and w >= 0 for w in m.weights):
            raise SchedulerError(f"model {m.name!r}: weights must be finite numbers >= 0, got {m.weights}")
    return tuple(items)  # type: ignore[arg-type]


def _check_distinct(tasks: Sequence[SearchTask]) -> None:
    first: dict[str, int] = {}
    for i, t in enumerate(tasks):
        if t.key in first:
            raise SchedulerError(f"tasks {first[t.key]} and {i} ({t}) are the same workload on the same target; "
                                 "give it once (TaskScheduler.from_models merges them)")
        first[t.key] = i
