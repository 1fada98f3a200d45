"""Making one generation's children: crossover and mutation of parents named by their steps.

Kept apart from selection so that the same code runs in the search process (`ChildMaker`) or, split
by parent, in forked worker processes (`ChildWorkers`). Every job carries its own seed, so the
children do not depend on where, or in how many processes, they were made. A child is valid when
the feature extractor can derive its statements; the features it computes on the way are the ones
the cost model scores, so validation costs nothing extra.
"""

from __future__ import annotations

import math
import multiprocessing
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.errors import ScheduleError
from tensorgen.features.extractor import FeatureExtractor
from tensorgen.schedule.replay import PrefixReplayer
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import Step
from tensorgen.search.annotate import AnnotationPolicy, sample_state
from tensorgen.search.crossover import crossover, match_sketch, step_owners
from tensorgen.search.gc_relief import relax_worker_collections
from tensorgen.search.mutations import Mutation, mutate
from tensorgen.search.task import SearchTask

Steps = tuple[Step, ...]


@dataclass(frozen=True)
class ChildJob:
    parent: Steps
    other: Steps | None  # crossover partner; None: no crossover
    mutate: bool  # mutate the parent when there is no (valid) crossover child
    seed: int


@dataclass(frozen=True)
class SampleJob:
    """A random program: random annotation of sketch `sketch` with its own random stream."""

    sketch: int
    seed: int


@dataclass
class ChildResult:
    steps: Steps | None = None  # None: no valid child, the slot keeps its parent
    crossed: bool | None = None  # crossover tried: whether it gave a valid child
    mutated: bool = False
    mutation_failures: int = 0


class LazyState(State):
    """A State known by its steps; the stages are replayed on first use (most children are only scored)."""

    def __init__(self, replayer: PrefixReplayer, steps: Steps):
        self.dag, self.steps, self._stages, self._replayer = replayer.dag, tuple(steps), None, replayer

    @property  # type: ignore[override]
    def stages(self):
        if self._stages is None:
            self._stages = self._replayer(self.steps).stages
        return self._stages

    @stages.setter
    def stages(self, value) -> None:
        self._stages = value

    def __reduce__(self):
        """Pickled as the plain State it stands for: the replayer and its prefix cache (megabytes after an
        evolution) stay in this process, or every candidate sent to a builder would carry them."""
        return _plain_state, (self.dag, self.steps, self.stages)


def _plain_state(dag, steps: Steps, stages) -> State:
    state = State.__new__(State)
    state.dag, state.steps, state.stages = dag, steps, stages
    return state


class ChildMaker:
    """Children in this process. A failed crossover falls back to a mutation; a failed mutation is
    retried (same parent, the job's random stream) up to `max_tries` times."""

    def __init__(self, task: SearchTask, extractor: FeatureExtractor, sketches: Sequence[State],
                 mutations: Sequence[Mutation] | None, max_tries: int = 4, capacity: int = 50_000,
                 annotation: AnnotationPolicy | None = None):
        self.task, self.extractor, self.sketches = task, extractor, list(sketches)
        self.annotation = annotation or AnnotationPolicy()
        self.mutations, self.max_tries, self.capacity = mutations, max_tries, capacity
        self._states: OrderedDict[Steps, State] = OrderedDict()
        self._owners = [step_owners(sk) for sk in self.sketches]

    def remember(self, state: State) -> None:
        self._states[state.steps] = state
        if len(self._states) > self.capacity:
            self._states.popitem(last=False)

    def state(self, steps: Steps) -> State:
        hit = self._states.get(steps)
        if hit is None:
            hit = LazyState(self.task.replayer, steps)
            self.remember(hit)
        return hit

    def _valid(self, states: Sequence[State | None]) -> list[bool]:
        real = [s for s in states if s is not None]
        ok = iter(f.shape[0] > 0 for f in self.extractor.extract(real))
        return [s is not None and next(ok) for s in states]

    def _crossover(self, a: State, b: State, rng: np.random.Generator) -> State | None:
        k = match_sketch(a, self.sketches)
        if k is None or k != match_sketch(b, self.sketches) or a.steps == b.steps:
            return None
        return crossover(self.task, a, b, len(self.sketches[k].steps), self._owners[k], rng)

    def sample(self, jobs: Sequence[SampleJob]) -> list[Steps | None]:
        """The valid random programs of `jobs` (None where the sample does not apply or lower)."""
        states: list[State | None] = []
        for job in jobs:
            try:
                states.append(sample_state(self.task, self.sketches[job.sketch], np.random.default_rng(job.seed),
                                           self.annotation))
            except ScheduleError:
                states.append(None)
        out: list[Steps | None] = []
        for st, ok in zip(states, self._valid(states)):
            if ok:
                self.remember(st)  # type: ignore[arg-type]
            out.append(st.steps if ok else None)  # type: ignore[union-attr]
        return out

    def make(self, jobs: Sequence[ChildJob]) -> list[ChildResult]:
        rngs = [np.random.default_rng(j.seed) for j in jobs]
        parents = [self.state(j.parent) for j in jobs]
        results = [ChildResult() for _ in jobs]
        crossing = [k for k, j in enumerate(jobs) if j.other is not None]
        kids = [self._crossover(parents[k], self.state(jobs[k].other), rngs[k]) for k in crossing]  # type: ignore[arg-type]
        for k, kid, ok in zip(crossing, kids, self._valid(kids)):
            results[k].crossed = ok
            if ok:
                results[k].steps = kid.steps  # type: ignore[union-attr]
                self.remember(kid)  # type: ignore[arg-type]
        todo = [k for k, j in enumerate(jobs) if results[k].steps is None and (j.mutate or j.other is not None)]
        for _ in range(self.max_tries):
            if not todo:
                break
            kids = [mutate(self.task, parents[k], rngs[k], self.mutations)[0] for k in todo]
            failed = []
            for k, kid, ok in zip(todo, kids, self._valid(kids)):
                if ok:
                    results[k].steps, results[k].mutated = kid.steps, True  # type: ignore[union-attr]
                    self.remember(kid)  # type: ignore[arg-type]
                else:
                    results[k].mutation_failures += 1
                    failed.append(k)
            todo = failed
        return results


def _serve(maker: ChildMaker, conn) -> None:
    """A worker: run each (kind, jobs) received, send back the new programs' steps with their features."""
    relax_worker_collections()
    while True:
        msg = conn.recv()
        if msg is None:
            return
        kind, jobs = msg
        made = maker.sample(jobs) if kind == "sample" else maker.make(jobs)
        steps = made if kind == "sample" else [r.steps for r in made]
        feats = [None if st is None else maker.extractor.extract_one(maker.state(st)) for st in steps]
        conn.send((made, feats))


def _stop(conns, procs) -> None:
    for c in conns:
        try:
            c.send(None)
        except (OSError, ValueError):
            pass
    for p in procs:
        p.join(timeout=1.0)
        if p.is_alive():
            p.terminate()


class ChildWorkers:
    """`n` forked ChildMakers. A job goes to the worker that made its parent (which holds that State;
    others would replay it), rebalanced so no worker gets much more than its share; the children's
    features come back and go into the search process's extractor cache, where scoring finds them."""

    def __init__(self, maker: ChildMaker, n: int):
        ctx = multiprocessing.get_context("fork")
        self.maker, self.conns, self.procs = maker, [], []
        for _ in range(n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(maker, theirs), daemon=True)
            proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)
        self._home: OrderedDict[Steps, int] = OrderedDict()  # steps -> worker that holds the state
        self._finalizer = weakref.finalize(self, _stop, self.conns, self.procs)

    def close(self) -> None:
        self._finalizer()

    def make(self, jobs: Sequence[ChildJob]) -> list[ChildResult]:
        n = len(self.conns)
        share = math.ceil(len(jobs) / n * 1.1)
        queues: list[list[int]] = [[] for _ in range(n)]
        for k, job in enumerate(jobs):
            w = self._home.get(job.parent, k % n)
            queues[w if len(queues[w]) < share else min(range(n), key=lambda i: len(queues[i]))].append(k)
        return self._run("make", jobs, queues, lambda r: r.steps, ChildResult)  # type: ignore[return-value]

    def sample(self, jobs: Sequence[SampleJob]) -> list[Steps | None]:
        n = len(self.conns)
        return self._run("sample", jobs, [list(range(w, len(jobs), n)) for w in range(n)], lambda r: r, lambda: None)

    def _run(self, kind: str, jobs: Sequence, queues: list[list[int]], steps_of, empty) -> list:
        for w, q in enumerate(queues):
            self.conns[w].send((kind, [jobs[k] for k in q]))
        results = [empty() for _ in jobs]
        wk = self.maker.task.workload_key
        for w, q in enumerate(queues):
            got, feats = self.conns[w].recv()
            for k, res, f in zip(q, got, feats):
                results[k] = res
                if (steps := steps_of(res)) is not None:
                    self.maker.extractor.add((wk, steps), f)
                    self._home[steps] = w
        while len(self._home) > self.maker.capacity:
            self._home.popitem(last=False)
        return results
