"""Making one generation's children: crossover and mutation of parents named by their steps.

Kept apart from selection so that the same code runs in the search process (`ChildMaker`) or, split
by parent, in forked worker processes (`ChildWorkers`). Every job carries its own seed, so the
children do not depend on where, or in how many processes, they were made. A child is valid when
the feature extractor can derive its statements; the features it computes on the way are the ones
the cost model scores, so validation costs nothing extra.

An operation that raises (a bug in a rule, a sample, the feature extractor) is skipped and counted in the
maker's `skips` (tensorgen.search.skips); a worker that dies or raises is restarted and its jobs made again
in the search process, so neither ends the tuning run.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import traceback
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.errors import ScheduleError
from tensorgen.features.extractor import FeatureExtractor, state_key
from tensorgen.features.layout import N_FEATURES
from tensorgen.measure.worker import die_with_parent
from tensorgen.schedule.replay import PrefixReplayer
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import Step
from tensorgen.search.annotate import AnnotationPolicy
from tensorgen.search.crossover import crossover, match_sketch, step_owners
from tensorgen.search.gc_relief import relax_worker_collections
from tensorgen.search.mutations import Mutation, mutate
from tensorgen.search.skips import Skips
from tensorgen.search.targets import for_target
from tensorgen.task import SearchTask

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
        self.source = self.dag  # the search's states have no layout step

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
    state.dag, state.source, state.steps, state.stages = dag, dag, steps, stages  # a search state: no layout step
    return state


class ChildMaker:
    """Children in this process. A failed crossover falls back to a mutation; a failed mutation is
    retried (same parent, the job's random stream) up to `max_tries` times."""

    def __init__(self, task: SearchTask, extractor: FeatureExtractor, sketches: Sequence[State],
                 mutations: Sequence[Mutation] | None, max_tries: int = 4, capacity: int = 50_000,
                 annotation: AnnotationPolicy | None = None, skips: Skips | None = None):
        self.task, self.extractor, self.sketches = task, extractor, list(sketches)
        self.skips = skips if skips is not None else Skips()
        self.sampler = for_target(task).sample
        self.annotation = annotation or for_target(task).annotation()
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

    def features(self, states: Sequence[State]) -> list[np.ndarray]:
        """The extractor's features of `states` (no rows: the state does not lower); a state whose extraction
        raises gets no rows and is counted (found by extracting the batch's states one by one)."""
        with self.skips.guard("feature extraction", f"a batch of {len(states)} programs of {self.task}"):
            return self.extractor.extract(states)
        out = []
        for state in states:
            feats = None
            with self.skips.guard("feature extraction", f"a program of {self.task}"):
                (feats,) = self.extractor.extract([state])
            out.append(feats if feats is not None else np.zeros((0, N_FEATURES)))
        return out

    def _valid(self, states: Sequence[State | None], features: bool = True) -> list[bool]:
        """Which states are programs: they have features (`features` false: a finite estimate, the extractor's)."""
        real = [s for s in states if s is not None]
        ok = iter(f.shape[0] > 0 for f in self.features(real)) if features \
            else iter(np.isfinite(self.extractor.estimates(real)))
        return [s is not None and next(ok) for s in states]

    def _crossover(self, a: State, b: State, rng: np.random.Generator) -> State | None:
        kid = None
        with self.skips.guard("crossover", str(self.task)):
            k = match_sketch(a, self.sketches)
            if k is None or k != match_sketch(b, self.sketches) or a.steps == b.steps:
                return None
            kid = crossover(self.task, a, b, len(self.sketches[k].steps), self._owners[k], rng)
        return kid

    def sample(self, jobs: Sequence[SampleJob]) -> list[Steps | None]:
        """The valid random programs of `jobs` (None where the sample does not apply or lower)."""
        states: list[State | None] = []
        for job in jobs:
            state = None
            with self.skips.guard("random annotation", f"sketch {job.sketch} of {self.task}"):
                try:
                    state = self.sampler(self.task, self.sketches[job.sketch], np.random.default_rng(job.seed),
                                         self.annotation)
                except ScheduleError:
                    pass
            states.append(state)
        out: list[Steps | None] = []
        for st, ok in zip(states, self._valid(states)):
            if ok:
                self.remember(st)  # type: ignore[arg-type]
            out.append(st.steps if ok else None)  # type: ignore[union-attr]
        return out

    def run(self, kind: str, jobs: Sequence, features: bool = True) -> list:
        """One message's jobs: "sample" (SampleJob -> steps or None), "make" (ChildJob -> ChildResult) or
        "features" (steps, returned as they are: whoever reads the states' features computes them)."""
        if kind == "sample":
            return self.sample(jobs)
        return list(jobs) if kind == "features" else self.make(jobs, features)

    def make(self, jobs: Sequence[ChildJob], features: bool = True) -> list[ChildResult]:
        """The children of `jobs`, each a valid program (`features` false: valid by the extractor's estimate, and
        no features computed)."""
        rngs = [np.random.default_rng(j.seed) for j in jobs]
        parents = [self.state(j.parent) for j in jobs]
        results = [ChildResult() for _ in jobs]
        crossing = [k for k, j in enumerate(jobs) if j.other is not None]
        kids = [self._crossover(parents[k], self.state(jobs[k].other), rngs[k]) for k in crossing]  # type: ignore[arg-type]
        for k, kid, ok in zip(crossing, kids, self._valid(kids, features)):
            results[k].crossed = ok
            if ok:
                results[k].steps = kid.steps  # type: ignore[union-attr]
                self.remember(kid)  # type: ignore[arg-type]
        todo = [k for k, j in enumerate(jobs) if results[k].steps is None and (j.mutate or j.other is not None)]
        for _ in range(self.max_tries):
            if not todo:
                break
            kids = [mutate(self.task, parents[k], rngs[k], self.mutations, self.skips)[0] for k in todo]
            failed = []
            for k, kid, ok in zip(todo, kids, self._valid(kids, features)):
                if ok:
                    results[k].steps, results[k].mutated = kid.steps, True  # type: ignore[union-attr]
                    self.remember(kid)  # type: ignore[arg-type]
                else:
                    results[k].mutation_failures += 1
                    failed.append(k)
            todo = failed
        return results


def _serve(maker: ChildMaker, conn, parent: int) -> None:
    """A worker: run each (kind, jobs) received, send back the new programs' steps with their features and the
    operations skipped on the way (logged by the search process, once). Ends when the parent closes the pipe
    or dies."""
    die_with_parent(parent)
    relax_worker_collections()
    while True:
        try:
            while not conn.poll(1.0):
                if os.getppid() != parent:  # where no parent-death signal exists
                    return
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        kind, jobs, features = msg
        maker.skips = Skips(log=False)
        try:
            made = maker.run(kind, jobs, features)
            steps = [r.steps for r in made] if kind == "make" else made
            states = [maker.state(st) for st in steps if st is not None]
            feats = maker.features(states) if features else [None] * len(states)
            estimates = [maker.extractor.estimate_of(state_key(s)) for s in states] \
                if maker.extractor.estimate is not None else [None] * len(states)
            reply: tuple | str = (made, feats, estimates, maker.skips)
        except Exception:  # noqa: BLE001 - reported to the search process, which redoes the jobs
            reply = traceback.format_exc()
        conn.send(reply)


class SearchWorkerError(RuntimeError):
    """A search worker's jobs raised outside the guarded operations (the message is its last traceback line)."""


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
        self.maker, self.conns, self.procs = maker, [], []
        for _ in range(n):
            self.conns.append(None)
            self.procs.append(None)
            self._start(len(self.procs) - 1)
        self._home: OrderedDict[Steps, int] = OrderedDict()  # steps -> worker that holds the state
        self._finalizer = weakref.finalize(self, _stop, self.conns, self.procs)

    def _start(self, w: int) -> None:
        """Fork worker `w` (again): it starts with everything the search process's maker knows now."""
        ctx = multiprocessing.get_context("fork")
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(self.maker, theirs, os.getpid()), daemon=True)
        proc.start()
        theirs.close()
        self.conns[w], self.procs[w] = mine, proc

    def _restart(self, w: int, exc: BaseException) -> None:
        """Worker `w` died or broke its protocol: count it, end what is left of it and fork a new one."""
        proc = self.procs[w]
        self.maker.skips.note("search worker", f"a worker of {self.maker.task}", exc)
        self.conns[w].close()
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=5.0)
        self._start(w)
        self._home = OrderedDict((k, v) for k, v in self._home.items() if v != w)

    def close(self) -> None:
        self._finalizer()

    def _queues(self, homes: Sequence[Steps]) -> list[list[int]]:
        """Job k to the worker that holds the state `homes[k]` (else round robin), rebalanced so that no worker
        gets much more than its share."""
        n = len(self.conns)
        share = math.ceil(len(homes) / n * 1.1)
        queues: list[list[int]] = [[] for _ in range(n)]
        for k, steps in enumerate(homes):
            w = self._home.get(steps, k % n)
            queues[w if len(queues[w]) < share else min(range(n), key=lambda i: len(queues[i]))].append(k)
        return queues

    def make(self, jobs: Sequence[ChildJob], features: bool = True) -> list[ChildResult]:
        queues = self._queues([job.parent for job in jobs])
        return self._run("make", jobs, queues, lambda r: r.steps, ChildResult, features)  # type: ignore[return-value]

    def sample(self, jobs: Sequence[SampleJob]) -> list[Steps | None]:
        n = len(self.conns)
        return self._run("sample", jobs, [list(range(w, len(jobs), n)) for w in range(n)], lambda r: r, lambda: None)

    def features(self, states: Sequence[State]) -> list[np.ndarray]:
        """ChildMaker.features, the uncached states' features computed by the workers (each state by the worker
        that made it, where it is built already)."""
        todo = [s.steps for s in self.maker.extractor.uncached(states)]
        if len(todo) >= len(self.conns):
            self._run("features", todo, self._queues(todo), lambda r: r, lambda: None)
        return self.maker.features(states)

    def _run(self, kind: str, jobs: Sequence, queues: list[list[int]], steps_of, empty, features: bool = True) -> list:
        """Send each worker its queue, collect the answers; a worker that died (or answered nonsense) is
        restarted, and its jobs are made in this process (same seeds, same children)."""
        sent = []
        for w, q in enumerate(queues):
            try:
                self.conns[w].send((kind, [jobs[k] for k in q], features))
                sent.append(True)
            except (OSError, ValueError) as exc:
                self._restart(w, exc)
                sent.append(False)
        results = [empty() for _ in jobs]
        wk = self.maker.task.workload_key
        for w, q in enumerate(queues):
            answer = None
            if sent[w]:
                try:
                    answer = self._answer(w, len(q))
                except (EOFError, OSError, ValueError, TypeError, SearchWorkerError) as exc:
                    self._restart(w, exc)
            if answer is None:
                for k, res in zip(q, self.maker.run(kind, [jobs[k] for k in q], features)):
                    results[k] = res
                continue
            got, feats, estimates = answer
            made = zip(feats, estimates)
            for k, res in zip(q, got):
                results[k] = res
                if (steps := steps_of(res)) is not None:
                    feat, estimate = next(made)
                    if feat is not None:
                        self.maker.extractor.add((wk, steps), feat, estimate)
                    elif estimate is not None:
                        self.maker.extractor.add_estimate((wk, steps), estimate)
                    self._home[steps] = w
        while len(self._home) > self.maker.capacity:
            self._home.popitem(last=False)
        return results

    def _answer(self, w: int, n: int) -> tuple[list, list, list]:
        """Worker w's answer to n jobs (its skipped operations go to the search process's count)."""
        reply = self.conns[w].recv()
        if isinstance(reply, str):
            raise SearchWorkerError(reply.strip().splitlines()[-1])
        got, feats, estimates, skips = reply
        if len(got) != n:
            raise ValueError(f"search worker {w} answered {len(got)} results for {n} jobs")
        self.maker.skips.absorb(skips)
        return got, feats, estimates
