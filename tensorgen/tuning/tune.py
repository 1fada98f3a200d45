"""tune(): search one task — propose, build, run, record, learn — until the trial budget is spent.

A `TaskTuner` holds one task's search between measurement rounds (the policy with its trained cost
model, the measured set, counters); `tune()` is a loop of its rounds, and the task scheduler interleaves
the rounds of many tuners that share one `MeasureSetup` (builder, runner, database). What was measured
lives in the database (every record is committed as it arrives, so an interrupted run loses nothing and
the next one resumes), what was learned lives in the policy, and anything a user wants to see happens in
callbacks.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tensorgen.costmodel.base import CostModel
from tensorgen.costmodel.shipped import shipped_pacm
from tensorgen.dag import ComputeDAG
from tensorgen.errors import TensorgenError, TuneError
from tensorgen.hardware import hardware_for
from tensorgen.measure.builder import Builder
from tensorgen.measure.calibration import busy_bound
from tensorgen.measure.runner import Runner
from tensorgen.measure.types import (
    MEASURE_ATTEMPTS,
    BuildResult,
    ErrorKind,
    MeasureInput,
    MeasureResult,
    measure_again,
)
from tensorgen.records.database import Database, SQLiteDatabase
from tensorgen.records.record import Record, steps_hash
from tensorgen.runtime.cuda import cuda_available
from tensorgen.schedule.state import State
from tensorgen.search.policy import SearchPolicy
from tensorgen.search.skips import Skips
from tensorgen.target import HardwareParams, Target
from tensorgen.task import SearchTask
from tensorgen.te.tensor import Tensor
from tensorgen.tuning.busy import BusySummary, BusyWatch
from tensorgen.tuning.progress import ProgressLine, shows_progress
from tensorgen.tuning.registry import BUILDERS, COST_MODELS, POLICIES, RUNNERS
from tensorgen.tuning.runinfo import operator_run
from tensorgen.tuning.tally import RETIMES, Callback, Tally, TuneProgress

LOGGER = logging.getLogger("tensorgen.tuning.tune")



@dataclass
class TuneResult:
    """The outcome of one tune() call. Times are wall-clock seconds of this call.

    `search_overhead_s` is the time the search itself took (policy next_batch/update and replaying the
    database on resume) — the part a better policy or cost model makes cheaper; database commits and
    callbacks are counted in none of overhead, build or run.
    """

    task: SearchTask
    best_state: State | None
    best_cost: float
    best_gflops: float
    trials: int
    total_trials: int
    tuning_wall_s: float
    search_overhead_s: float
    build_s: float
    run_s: float
    errors: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False
    skipped: dict[str, int] = field(default_factory=dict)  # search operations that raised, per kind (search.skips)
    retimed: int = 0  # extra measurements of programs that became the best (see RETIMES)
    busy: BusySummary = BusySummary()  # the machine's load seen while measuring (tuning.busy)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (no State; `best_steps` is its step list as JSON text)."""
        return {
            "workload_key": self.task.workload_key, "target": str(self.task.target), "desc": self.task.desc,
            "best_seconds": self.best_cost if math.isfinite(self.best_cost) else None,
            "best_gflops": self.best_gflops, "trials": self.trials, "total_trials": self.total_trials,
            "tuning_wall_s": self.tuning_wall_s, "search_overhead_s": self.search_overhead_s,
            "build_s": self.build_s, "run_s": self.run_s, "errors": dict(self.errors),
            "interrupted": self.interrupted, "skipped": dict(self.skipped), "retimed": self.retimed,
            "busy": self.busy.to_dict(),
            "best_steps": self.best_state.to_json() if self.best_state is not None else None,
        }


def make_task(task_or_dag: SearchTask | ComputeDAG | Tensor | Sequence[Tensor], target: str | Target = "cpu",
              hw: HardwareParams | None = None, desc: str = "") -> SearchTask:
    """A SearchTask from a task (returned as is), a ComputeDAG, or the tensors of one."""
    if isinstance(task_or_dag, SearchTask):
        return task_or_dag
    dag = task_or_dag if isinstance(task_or_dag, ComputeDAG) else ComputeDAG(task_or_dag)
    target = Target.parse(target)
    return SearchTask(dag, target, hw if hw is not None else hardware_for(target), desc)


def check_searchable(target: Target) -> None:
    """TuneError unless candidates for `target` can be measured here: a CUDA target needs a usable GPU, or
    `-emulate=1` (programs run on this CPU under codegen.cuda_emu: right answers, times that say nothing of a
    GPU's)."""
    if target.kind == "cuda" and not target.emulated and not cuda_available():
        raise TuneError(f"target {target}: no CUDA GPU is usable on this machine; add -emulate=1 to search and check "
                        "programs on this CPU (their times say nothing of a GPU's)")


def make_policy(task: SearchTask, policy: str | SearchPolicy, cost_model: str | CostModel = "auto",
                seed: int = 0, policy_options: dict[str, Any] | None = None,
                skips: Skips | None = None) -> SearchPolicy:
    """The policy a name of tuning.registry.POLICIES stands for ("ansor": SketchPolicy; "random"), made with the
    cost model `cost_model` (a name of COST_MODELS or an instance) and `seed`, counting its failed operations
    in `skips`; an instance passes through.

    `policy_options` are keyword arguments for that policy's constructor (e.g. `generations=0`,
    `population=512` or `sketches=[...]` for SketchPolicy; `sketches=` for RandomPolicy); they
    cannot go with a policy instance.
    """
    options = dict(policy_options or {})
    if not isinstance(policy, str):
        if options:
            raise TuneError("policy_options apply to a policy named by a string, not to a SearchPolicy instance")
        return policy
    if "cost_model" in options:
        raise TuneError("pass the cost model as tune(cost_model=...), not in policy_options")
    POLICIES.get(policy)  # an unknown name is reported before a cost model is made for it
    return POLICIES.create(policy, task, cost_model=make_cost_model(cost_model, seed, task.target, policy),
                           seed=seed, skips=skips, **options)


# The search-space / search-strategy variants of Ansor's ablation (paper Figure 7).
ABLATIONS = ("ansor", "no-crossover", "no-fine-tuning", "limited-space", "uniform-tiles", "random")


def ablation_policy(name: str, task: SearchTask) -> tuple[str, dict[str, Any]]:
    """(policy, policy_options) for tune() that make one of the ABLATIONS variants of Figure 7:

    - "ansor": the full policy (all sketches, evolutionary fine-tuning, learned cost model);
    - "no-crossover": the same without node-based crossover (mutations only, as TVM's implementation);
    - "no-fine-tuning": the same, with 0 generations of evolution: each batch is the random samples
      of all sketches ranked by the cost model (random sampling only, no mutation or crossover);
    - "limited-space": the full search over a template-like space: only the plain multi-level-tiling
      sketch (rules AlwaysInline, MultiLevelTiling, SkipStage; no cache write, fusion or rfactor);
    - "uniform-tiles": the full policy with Ansor's uniform tile sizes only (no register-tile prior,
      `AnnotationPolicy.register_tile_share=0`);
    - "random": RandomPolicy (random annotations of all sketches, no cost model).
    """
    key = name.lower()
    if key == "ansor":
        return "ansor", {}
    if key == "no-crossover":
        return "ansor", {"crossover_prob": 0.0}
    if key == "no-fine-tuning":
        return "ansor", {"generations": 0}
    if key == "limited-space":
        from tensorgen.search.sketch import SPACES

        return "ansor", {"sketches": SPACES.create("limited", task)}
    if key == "uniform-tiles":
        from tensorgen.search.annotate import AnnotationPolicy

        return "ansor", {"annotation": AnnotationPolicy(register_tile_share=0.0)}
    if key == "random":
        return "random", {}
    raise TuneError(f"unknown ablation {name!r}; choose one of {', '.join(ABLATIONS)}")


def make_cost_model(cost_model: str | CostModel, seed: int = 0, target: str | Target | None = None,
                    policy: object = None) -> CostModel:
    """The cost model a name of tuning.registry.COST_MODELS stands for ("xgb", "random", "pacm"; "NAME:FILE" starts
    from the saved model FILE, e.g. a pretrained "pacm:model.pt"); instances pass through. "auto" (the default) is
    what measured best for `policy`: for "pruner", the PaCM pretrained for the kind of machine `target` runs on
    that ships with tensorgen (costmodel.shipped; momentum transfer from it) where there is one, else PaCM learned
    online (with PyTorch installed); XGBoost otherwise."""
    if not isinstance(cost_model, str):
        return cost_model
    if cost_model == "auto":
        cost_model = "xgb"
        if policy == "pruner" and target is not None and Target.parse(target).kind == "cpu" \
                and importlib.util.find_spec("torch") is not None:
            shipped = shipped_pacm(target)
            cost_model = f"pacm:{shipped}" if shipped is not None else "pacm"
    name, _, path = cost_model.partition(":")
    return COST_MODELS.create(name, seed=seed, **({"path": path} if path else {}))


@dataclass(frozen=True)
class MeasureConfig:
    """How candidates are built and timed: a builder and a runner, each a name of tuning.registry's BUILDERS /
    RUNNERS (made with the timeouts and `runner_options`) or an instance (used as it is, not closed).

    The "local" runner times each candidate in 3 repeats of >= 10 ms, checks its output against the naive
    program's, times a candidate GIVE_UP_FACTOR times slower than the task's fastest by its first call alone and
    kills one SLOW_FACTOR times slower (tuning.registry.local_runner); `run_timeout` bounds every call. It times
    hot unless `runner_options={"evict_weights": True}` (a model's tasks: TaskScheduler.tune's default).
    `busy_bound`: a calibration kernel timed with each batch this many times slower than quiet marks the batch's
    measurements (tuning.busy; None: $TENSORGEN_BUSY_BOUND, else measure.calibration.BUSY_BOUND; 0: off); the local
    runner's option `quiet_s` gives the kernel's quiet time (default: the 4th fastest seen on this machine).
    """

    builder: str | Builder = "local"
    runner: str | Runner = "local"
    build_timeout: float = 15.0  # seconds per candidate
    run_timeout: float = 10.0
    runner_options: Mapping[str, Any] = field(default_factory=dict)
    busy_bound: float | None = None

    def __post_init__(self) -> None:
        if self.busy_bound is not None and not self.busy_bound >= 0:
            raise TuneError(f"busy_bound must be >= 0 (0: off), got {self.busy_bound}")
        if not (self.build_timeout > 0 and self.run_timeout > 0):
            raise TuneError(f"timeouts must be positive; got build_timeout={self.build_timeout}, "
                            f"run_timeout={self.run_timeout}")
        if self.runner_options and not isinstance(self.runner, str):
            raise TuneError("runner_options apply to a runner named by a string, not to a Runner instance")

    def on_ray(self, address: str) -> MeasureConfig:
        """This configuration with candidates built and timed on the Ray cluster at `address` (the head's
        HOST:PORT; see measure.ray), on its nodes that advertise the task's target."""
        return replace(self, builder="ray", runner="ray",
                      runner_options={**self.runner_options, "address": address})


@dataclass
class MeasureSetup:
    """Where programs are measured and recorded: one builder, runner and database, shared by every task of a
    tuning session (a model's tasks share them), and the watch on the machine's load (`bound` 0: none);
    `close()` closes only what `open` made itself."""

    db: Database
    builder: Builder
    runner: Runner
    _owned: list[Any] = field(default_factory=list, repr=False)
    rounds: int = 0  # rounds begun in the current run, by every tuner sharing this setup
    bound: float = 0.0
    watch: BusyWatch = field(init=False)

    def __post_init__(self) -> None:
        self.watch = BusyWatch(self.runner, self.bound)

    @classmethod
    def open(cls, db: str | Path | Database | None = None, config: MeasureConfig = MeasureConfig()) -> MeasureSetup:
        """`db` is a path, a Database, or None (in memory, gone on close); `config` names or holds the builder
        and runner."""
        owned: list[Any] = []
        bound = config.busy_bound if config.busy_bound is not None else busy_bound()
        if db is None or isinstance(db, (str, Path)):
            db = SQLiteDatabase.in_memory() if db is None else SQLiteDatabase(db)
            owned.append(db)
        builder, runner = config.builder, config.runner
        if isinstance(builder, str):
            builder = BUILDERS.create(builder, timeout=config.build_timeout)
            owned.append(builder)
        if isinstance(runner, str):
            runner = RUNNERS.create(runner, timeout=config.run_timeout, **config.runner_options)
            owned.append(runner)
        return cls(db, builder, runner, owned, bound=bound)

    def begin_run(self, info: Mapping[str, Any]) -> None:
        """A tuning run starts (see Database.begin_run; `info` from tensorgen.tuning.runinfo)."""
        self.db.begin_run(info)
        self.rounds = 0

    def next_round(self) -> None:
        """A tuner starts a round: the records it commits are tagged with the round's number in the run."""
        self.rounds += 1
        self.db.begin_round(self.rounds)

    def end_run(self, outcome: Mapping[str, Any]) -> None:
        """The run ended (see Database.end_run): how many trials it measured and why it stopped."""
        self.db.end_run(outcome)

    def close(self) -> None:
        for thing in reversed(self._owned):
            thing.close()
        self._owned.clear()

    def __enter__(self) -> MeasureSetup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TaskTuner:
    """One task's search, kept alive between measurement rounds: the policy (and its trained cost model),
    the set of measured programs and the counters. The task scheduler calls `round` many times; `tune()`
    is a loop over it. `resume()` (once, first) replays the database's records of the task into the
    policy; after that the database is only appended to.

    `trials` is the budget shown in progress reports; `search_s` is search time already spent on the task
    (building its policy), counted in its search overhead and wall time. A policy's proposal or update that
    raises is skipped (an empty proposal, an unlearned batch) and counted in `skips`, which the named
    policies (make_policy) share.
    """

    def __init__(self, task: SearchTask, policy: SearchPolicy, setup: MeasureSetup, *, trials: int = 0,
                 callbacks: Sequence[Callback] = (), search_s: float = 0.0, skips: Skips | None = None) -> None:
        self.task, self.policy, self.setup = task, policy, setup
        self.skips = skips if skips is not None else Skips()
        self.callbacks = tuple(callbacks)
        self.tally = Tally(task, trials, time.perf_counter(), policy_s=search_s, busy_s=search_s)
        self._measured: set[str] | None = None  # step hashes in the database, known after resume()
        self._again: list[Record] = []  # resumed records to measure again (see measure_again)
        self._busy: list[Record] = []  # ... of those, the ones marked busy: measured again when it is quiet
        self._marks: Counter[str] = Counter()  # step hash -> times marked busy in this run

    @property
    def costs(self) -> list[float]:
        """Every measured cost in seconds (inf: failed), the database's records first, in commit order."""
        return self.tally.costs

    @property
    def best_cost(self) -> float:
        return self.tally.best_cost

    @property
    def best_state(self) -> State | None:
        return self.tally.best_state

    @property
    def trials_done(self) -> int:
        """Programs measured by this tuner (resumed records not included)."""
        return self.tally.done

    def resume(self) -> TuneProgress:
        """Feed the database's records of this task to the policy (once) and report phase "resume"."""
        if self._measured is not None:
            raise TuneError(f"{self.task}: resume() was already called")
        tally, inputs, results = self.tally, [], []
        self._measured = set()
        tally.since = time.perf_counter()
        try:
            records = self.setup.db.records(self.task.workload_key, str(self.task.target))
            tries: dict[str, list[Record]] = {}
            for record in records:
                tries.setdefault(record.steps_hash, []).append(record)
            for record in records:
                same = tries[record.steps_hash]
                if measure_again([r.result for r in same]):  # it failed for the machine's sake, not its own
                    if record is same[0]:
                        busy = same[-1].result.error_kind == ErrorKind.BUSY
                        (self._busy if busy else self._again).append(record)
                    continue
                self._measured.add(record.steps_hash)
                try:
                    state = record.state(self.task.dag)
                except TensorgenError as err:  # a record a newer or broken version wrote: count it, don't learn
                    LOGGER.warning("cannot replay a stored record of %s: %s", self.task, err)
                    tally.observe(None, record.result)
                    continue
                tally.observe(state, record.result)
                inputs.append(MeasureInput(self.task, state))
                results.append(record.result)
            if inputs:
                with self.skips.guard("policy update", str(self.task)):
                    self.policy.update(inputs, results)
            self.setup.runner.note_fastest(self.task, tally.best_cost)
            tally.policy_s += time.perf_counter() - tally.since  # replaying the db is search time too
            return self._report(tally.progress("resume"))
        finally:
            tally.busy_s += time.perf_counter() - tally.since

    def round(self, n_trials: int) -> int:
        """One batch of up to `n_trials` new programs: propose, build, run and commit one by one, learn, report.
        Returns how many were measured; 0 means the policy has nothing new to propose."""
        if self._measured is None:
            raise TuneError(f"{self.task}: call resume() before round()")
        tally = self.tally
        tally.since = time.perf_counter()
        self.setup.next_round()
        try:
            quiet = self.setup.watch.begin_batch(self.task)
            proposed = self._measure_again(self._again, n_trials)
            quiet_again = self._measure_again(self._busy, n_trials - len(proposed)) if quiet else []
            proposed += quiet_again
            if len(proposed) < n_trials:
                with self.skips.guard("policy proposal", str(self.task)):
                    proposed += self.policy.next_batch(n_trials - len(proposed))
            tally.policy_s += time.perf_counter() - tally.since
            states = []
            for state in proposed:  # a policy that breaks its promise must not cost measurements
                key = steps_hash(state.to_json())
                if key not in self._measured:
                    self._measured.add(key)
                    states.append(state)
            if not states:
                return 0
            inputs = [MeasureInput(self.task, s) for s in states]
            results = self._measure(inputs, len(quiet_again))
            t0 = time.perf_counter()
            with self.skips.guard("policy update", str(self.task)):
                self.policy.update(inputs, results)
            tally.policy_s += time.perf_counter() - t0
            self._report(tally.progress("batch", inputs, results))
            return len(results)
        finally:
            tally.busy_s += time.perf_counter() - tally.since

    def _measure_again(self, records: list[Record], n: int) -> list[State]:
        """Up to `n` of `records` (taken from that list): programs whose measurements failed only for the machine's
        sake."""
        states = []
        while records and len(states) < n:
            record = records.pop(0)
            try:
                states.append(record.state(self.task.dag))
            except TensorgenError as err:
                LOGGER.warning("cannot replay a stored record of %s to measure it again: %s", self.task, err)
        return states

    def offer(self, states: Sequence[State]) -> None:
        """Hand the policy programs of this task made elsewhere (see SearchPolicy.offer)."""
        self.policy.offer(states)

    def release(self) -> None:
        """Stop the policy's worker processes until its next round (a model has dozens of tasks)."""
        self.policy.close()

    def confirm(self) -> int:
        """Re-time the best program until it has 1 + RETIMES measurements (a resumed database's best may have
        only one), trying each program once; returns how many measurements that took. Called before a final
        best or estimate is reported."""
        tally, tried, before = self.tally, set(), self.tally.retimed
        tally.since = time.perf_counter()
        try:
            while not tally.confirmed() and tally.best_key not in tried:
                tried.add(tally.best_key)
                self._retime(*self._build_best())
            return tally.retimed - before
        finally:
            tally.busy_s += time.perf_counter() - tally.since

    def remeasure(self) -> int:
        """Measure the best program once more, now (a re-timing, not a trial); returns how many measurements that
        took (0: there is no best yet)."""
        tally = self.tally
        if tally.best_state is None:
            return 0
        tally.since = time.perf_counter()
        try:
            (inp,), (built,) = self._build_best()
            self._run(inp, built)
            tally.retimed += 1
            return 1
        finally:
            tally.busy_s += time.perf_counter() - tally.since

    def _build_best(self) -> tuple[list[MeasureInput], list[BuildResult]]:
        """The best program as a batch of one, built."""
        inp = MeasureInput(self.task, self.tally.best_state)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        built = self.setup.builder.build([inp])
        self.tally.build_s += time.perf_counter() - t0
        return [inp], built

    def _measure(self, inputs: list[MeasureInput], remeasured: int = 0) -> list[MeasureResult]:
        """Build and time `inputs` (`remeasured` of them programs marked busy before), commit them (marked busy
        where the machine was, see tuning.busy), re-time a new best; the results as measured, for the policy."""
        tally, watch = self.tally, self.setup.watch
        t0 = time.perf_counter()
        built = self.setup.builder.build(inputs)
        tally.build_s += time.perf_counter() - t0
        results: list[MeasureResult] = [None] * len(inputs)  # type: ignore[list-item]
        held: list[int] = []  # measured, committed at the next timing of the calibration kernel
        try:
            t0 = time.perf_counter()
            for i, res in self.setup.runner.run_each(inputs, built):  # in the order they finish
                tally.run_s += time.perf_counter() - t0
                results[i] = res
                held.append(i)
                tally.done += 1
                if res.error_kind != ErrorKind.NONE:
                    tally.errors[ErrorKind(res.error_kind).value] += 1
                if watch.due():
                    self._commit_held(inputs, results, held, watch.check(self.task))
                t0 = time.perf_counter()
            tally.run_s += time.perf_counter() - t0
            self._commit_held(inputs, results, held, watch.check(self.task))
        finally:
            self._commit_held(inputs, results, held, watch.latest)  # interrupted: what the last timing said
        self._retime(inputs, built)
        watch.end_batch(remeasured)
        return results

    def _commit_held(self, inputs: list[MeasureInput], results: list[MeasureResult], held: list[int],
                     slowdown: float) -> None:
        """Commit the `held` results (emptied), marked busy if `slowdown` is past the bound."""
        while held:
            i = held.pop(0)
            self._commit(inputs[i], self.setup.watch.mark(results[i], slowdown))

    def _retime(self, inputs: Sequence[MeasureInput], built: Sequence[BuildResult]) -> None:
        """A best program among `inputs` that is not confirmed yet is measured until it has 1 + RETIMES
        measurements; when that makes it slower than another program, the new best gets its turn if it is
        among `inputs` too (each at most once)."""
        tally = self.tally
        todo = {steps_hash(inp.state.to_json()): (inp, br) for inp, br in zip(inputs, built)}
        while not tally.confirmed() and tally.best_key in todo:
            inp, br = todo.pop(tally.best_key)  # type: ignore[arg-type]
            for _ in range(1 + RETIMES - len(tally.runs[tally.best_key])):  # type: ignore[index]
                self._run(inp, br)
                tally.retimed += 1

    def _run(self, inp: MeasureInput, br: BuildResult) -> MeasureResult:
        """Time one built program, commit its record, count it."""
        t0 = time.perf_counter()
        (res,) = self.setup.runner.run([inp], [br])
        self.tally.run_s += time.perf_counter() - t0
        watch = self.setup.watch
        return self._commit(inp, watch.mark(res, watch.current(self.task)))

    def _commit(self, inp: MeasureInput, res: MeasureResult) -> MeasureResult:
        """Commit one measured program's record and count it; one marked busy is measured again when it is
        quiet."""
        record = Record.from_measure(self.task, inp.state, res)
        self.setup.db.commit_record(record)
        self.tally.observe(inp.state, res)
        if res.error_kind == ErrorKind.BUSY:
            self._marks[record.steps_hash] += 1
            if self._marks[record.steps_hash] < MEASURE_ATTEMPTS:
                self._busy.append(record)
                self._measured.discard(record.steps_hash)  # type: ignore[union-attr]
        return res

    def _report(self, progress: TuneProgress) -> TuneProgress:
        for cb in self.callbacks:
            cb(progress)
        return progress

    def result(self, interrupted: bool = False) -> TuneResult:
        t = self.tally
        return TuneResult(self.task, t.best_state, t.best_cost, t.best_gflops, t.done, len(t.costs), t.busy_s,
                          t.policy_s, t.build_s, t.run_s, {k: n for k, n in sorted(t.errors.items())}, interrupted,
                          self.skips.summary(), t.retimed, self.setup.watch.seen)

    def seconds(self) -> tuple[float, float, float]:
        """(search, build, run) seconds so far: what result() reports as search overhead, build and run."""
        return self.tally.policy_s, self.tally.build_s, self.tally.run_s

    def __repr__(self) -> str:
        return f"TaskTuner({self.task}, {self.tally.done} measured, best {self.tally.best_cost:.3g} s)"


def tune(task_or_dag: SearchTask | ComputeDAG | Tensor | Sequence[Tensor], trials: int = 64, *,
         db: str | Path | Database | None = None, policy: str | SearchPolicy = "ansor", cost_model: Any = "auto",
         policy_options: dict[str, Any] | None = None, measure: MeasureConfig = MeasureConfig(),
         target: str | Target = "cpu", batch_size: int = 64, seed: int = 0,
         callbacks: Sequence[Callback] = (), progress: bool | None = None) -> TuneResult:
    """Measure up to `trials` new programs of one task and return the best program known for it.

    `trials` is this call's budget: records already in `db` for this workload + target are replayed
    into the policy first (and counted in `total_trials`, and considered for the best), then `trials`
    more are measured in batches of `batch_size`, fewer only if the policy runs out of new programs or
    the run is interrupted. A state already in the database is measured again only if it failed for the
    machine's sake (see measure_again). `db` is a path, a Database, or None (in memory, gone after the call).
    `policy` is a name of tuning.registry.POLICIES ("ansor": SketchPolicy with `cost_model`, by default "auto":
    XGBoost, and for "pruner" PaCM, from the model that ships for the target's kind of machine if one does;
    "random") or a SearchPolicy instance (give it a fresh one: tune feeds it the database's records);
    `policy_options` are the named policy's options (e.g. `{"generations": 0}` or `{"sketches": [...]}` for
    "ansor"; see make_policy and ablation_policy). `measure` says how candidates are built and timed
    (MeasureConfig). `target` is used only when `task_or_dag` is not a SearchTask (make a SearchTask for other
    hardware parameters). `callbacks` see a TuneProgress after the resume and after every batch; `progress`
    shows a status line on stderr (ProgressLine, as `tensorgen tune` does): None where stderr is a terminal,
    True always, False never.
    Ctrl-C (KeyboardInterrupt, also from a callback; `tensorgen` turns SIGTERM into one) stops the loop; what
    was measured is kept and returned (`interrupted=True`), and saying so is the caller's business.
    """
    if trials < 0 or batch_size < 1:
        raise TuneError(f"need trials >= 0 and batch_size >= 1, got trials={trials}, batch_size={batch_size}")
    task = make_task(task_or_dag, target)
    check_searchable(task.target)
    t0 = time.perf_counter()
    # before opening the db: a bad policy (or policy option) creates no file
    skips = Skips()
    search = make_policy(task, policy, cost_model, seed, policy_options, skips)
    search_s = time.perf_counter() - t0
    interrupted = False
    shown = [ProgressLine()] if shows_progress(progress) else []
    with MeasureSetup.open(db, measure) as setup:
        tuner = TaskTuner(task, search, setup, trials=trials, callbacks=[*callbacks, *shown], search_s=search_s,
                          skips=skips)
        setup.begin_run(operator_run(task, trials, policy))
        try:
            tuner.resume()
            while tuner.trials_done < trials:
                if not tuner.round(min(batch_size, trials - tuner.trials_done)):
                    LOGGER.info("%s: the policy proposed no new program; stopping after %d trials", task,
                                tuner.trials_done)
                    break
            tuner.confirm()
        except KeyboardInterrupt:
            interrupted = True
            LOGGER.info("%s: interrupted after %d trials; every measured record is in the database", task,
                        tuner.trials_done)
        finally:
            for line in shown:
                line.close()
        setup.end_run({"trials": tuner.trials_done, "stopped": "interrupted" if interrupted else "budget"})
    return tuner.result(interrupted)
