"""Evolutionary search (Ansor §5.1): fine-tune sampled programs against the learned cost model.

Each generation the cost model scores the population (its predicted throughput is the fitness);
parents are drawn with probability proportional to fitness and each child is a mutation of one
parent (`tensorgen.search.mutations`), a node-based crossover of two, or a copy. The best distinct
programs seen in any generation are returned, so a bad generation never loses a good program.

Children are validated by the feature extractor, which lowers every state it scores anyway: a state
that does not lower has no statements and is dropped, so validation costs nothing extra.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.features.extractor import FeatureExtractor
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import SplitStep, Step
from tensorgen.search.annotate import AnnotationPolicy
from tensorgen.search.mutations import DEFAULT_MUTATIONS, LOCATION_STEPS, Mutation, is_flexible, mutate, replay
from tensorgen.search.policy import state_key
from tensorgen.search.sketch import generate_sketches
from tensorgen.search.task import SearchTask

# ---------------------------------------------------------------------------------------------
# node-based crossover


def _same_skeleton(sketch_step: Step, step: Step) -> bool:
    """`step` is `sketch_step` with its tile sizes filled in (lengths may differ, nothing else)."""
    if type(sketch_step) is not type(step):
        return False
    if isinstance(step, SplitStep):
        return (sketch_step.stage_id, sketch_step.iter_id, len(sketch_step.lengths), sketch_step.inner_to_outer) \
            == (step.stage_id, step.iter_id, len(step.lengths), step.inner_to_outer)
    return sketch_step == step


def match_sketch(state: State, sketches: Sequence[State]) -> int | None:
    """Index of the sketch `state` was annotated from (its steps start with the sketch's), if any."""
    for k, sk in enumerate(sketches):
        n = len(sk.steps)
        if len(state.steps) >= n and all(_same_skeleton(a, b) for a, b in zip(sk.steps, state.steps[:n])):
            return k
    return None


def step_owners(sketch: State) -> list[str]:
    """The name of the stage each sketch step transforms (ids shift as cache_write/rfactor add stages)."""
    s, out = State(sketch.dag), []
    for step in sketch.steps:
        out.append(s.stages[step.stage_id].name)
        s.apply(step)
    return out


def crossover(task: SearchTask, a: State, b: State, sketch_len: int, owners: Sequence[str],
              rng: np.random.Generator) -> State | None:
    """Node-based crossover of two programs of the same sketch (`sketch_len` steps, `owners` their stages).

    Every stage takes its steps — its tile sizes and its annotations — from one parent picked at
    random. A flexible stage computed at another stage follows that stage's parent, because the
    consumer's annotations were chosen around that attach point. Location steps go first (in
    descending stage order, as annotation made them), then the rest of each parent's steps in order;
    the child is verified by replay (None when a step no longer applies).
    """
    names = [st.name for st in a.stages]
    parent = {n: int(rng.integers(2)) for n in names}
    owned = set(owners) | {names[s.stage_id] for s in a.steps[sketch_len:] + b.steps[sketch_len:]}
    if len({parent[n] for n in owned}) < 2 and len(owned) > 1:
        flip = sorted(owned)[int(rng.integers(len(owned)))]
        parent[flip] = 1 - parent[flip]
    for i in range(len(names) - 1, -1, -1):
        src = (a, b)[parent[names[i]]]
        if src.stages[i].location == "at" and is_flexible(src, i):
            parent[names[i]] = parent[src.stages[i].attach[0]]
    steps: list[Step] = []
    for n, step in enumerate(a.steps[:sketch_len]):
        steps.append(b.steps[n] if isinstance(step, SplitStep) and parent[owners[n]] else step)
    mine = [[s for s in p.steps[sketch_len:] if parent[names[s.stage_id]] == k] for k, p in enumerate((a, b))]
    locations = sorted((s for m in mine for s in m if isinstance(s, LOCATION_STEPS)), key=lambda s: -s.stage_id)
    steps += locations + [s for m in mine for s in m if not isinstance(s, LOCATION_STEPS)]
    return replay(task, steps)


# ---------------------------------------------------------------------------------------------
# the search


@dataclass
class GenerationStats:
    """One generation: fitness of its population and what made it (for ablations and logs)."""

    generation: int
    size: int
    mean_score: float
    max_score: float
    best_k_mean: float  # mean predicted score of the best num_best distinct states seen so far
    mutated: int = 0
    crossed: int = 0
    crossover_failed: int = 0
    mutation_failed: int = 0
    seconds: float = 0.0


class EvolutionarySearch:
    """Evolve a population under `cost_model` and return the best predicted programs.

    A child is a crossover with `crossover_prob` (a mutation if the parents do not cross), else a
    mutation with `mutation_prob`, else a copy of its parent (as in Ansor); `crossover_prob=0` turns
    crossover off so its value can be measured.
    `elite_fraction` of each population's best are carried over unchanged (0 = Ansor: the best-k
    set alone keeps them). Crossover needs the task's `sketches` to know which parents are compatible.
    """

    def __init__(self, task: SearchTask, cost_model, extractor: FeatureExtractor | None = None,
                 rng: np.random.Generator | None = None, population: int = 2048, generations: int = 4,
                 mutation_prob: float = 0.85, crossover_prob: float = 0.05, elite_fraction: float = 0.0,
                 sketches: Sequence[State] | None = None, mutations: Sequence[Mutation] | None = None,
                 annotation: AnnotationPolicy | None = None, max_tries: int = 4):
        if not (0 <= mutation_prob <= 1 and 0 <= crossover_prob <= 1):
            raise ValueError("mutation_prob and crossover_prob are probabilities in [0, 1]")
        self.task, self.cost_model = task, cost_model
        self.extractor = extractor if extractor is not None else FeatureExtractor(task.hw)
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.population, self.generations = population, generations
        self.mutation_prob, self.crossover_prob, self.elite_fraction = mutation_prob, crossover_prob, elite_fraction
        self.sketches = list(sketches) if sketches is not None else None
        self.mutations = list(mutations) if mutations is not None else None
        self.annotation = annotation
        self.max_tries = max_tries
        self.history: list[GenerationStats] = []
        self._owners: dict[int, list[str]] = {}

    # ---- fitness --------------------------------------------------------------------------

    def score(self, states: Sequence[State]) -> np.ndarray:
        """Predicted fitness; -inf for states that do not lower (no statements)."""
        feats = self.extractor.extract(states)
        scores = np.asarray(self.cost_model.predict(feats), dtype=np.float64).reshape(-1)
        return np.where([f.shape[0] > 0 for f in feats], scores, -np.inf)

    def _valid(self, states: Sequence[State | None]) -> list[bool]:
        """Which children lower (one batched feature extraction; the features are cached for scoring)."""
        real = [s for s in states if s is not None]
        ok = iter(f.shape[0] > 0 for f in self.extractor.extract(real))
        return [s is not None and next(ok) for s in states]

    # ---- operators ------------------------------------------------------------------------

    def _sketch_of(self, state: State) -> int | None:
        if self.sketches is None:
            self.sketches = generate_sketches(self.task)
        return match_sketch(state, self.sketches)

    def _crossover(self, a: State, b: State) -> State | None:
        k = self._sketch_of(a)
        if k is None or k != self._sketch_of(b) or a.steps == b.steps:
            return None
        if k not in self._owners:
            self._owners[k] = step_owners(self.sketches[k])
        return crossover(self.task, a, b, len(self.sketches[k].steps), self._owners[k], self.rng)

    def _mutate(self, state: State) -> State | None:
        rules = self.mutations
        if rules is None and self.annotation is not None:  # the default table, under this policy's knobs
            rules = [copy.copy(r) for r in DEFAULT_MUTATIONS]
            for r in rules:
                r.policy = self.annotation
            self.mutations = rules
        return mutate(self.task, state, self.rng, rules)[0]

    def _children(self, pop: list[State], scores: np.ndarray, stats: GenerationStats) -> list[State]:
        """The next population. Children are made for all slots first and validated together (one
        batched feature extraction per attempt); a slot whose child does not lower retries a mutation
        of a freshly drawn parent, up to `max_tries` times, and then keeps its parent."""
        valid = np.isfinite(scores)
        # shift to positive; the floor keeps the worst valid program selectable
        floor = 1e-3 * float(np.ptp(scores[valid])) + 1e-12
        fit = np.where(valid, scores - scores[valid].min() + floor, 0.0) if valid.any() else np.ones(len(pop))
        probs = fit / fit.sum()
        n_elite = int(self.elite_fraction * self.population)
        elites = [pop[int(i)] for i in np.argsort(-scores, kind="stable")[:n_elite] if valid[i]]
        n = self.population - len(elites)
        parents = [pop[int(i)] for i in self.rng.choice(len(pop), size=n, p=probs)]
        out: list[State] = list(parents)  # a slot that gets no valid child keeps its parent
        crossing = self.rng.random(n) < self.crossover_prob
        mutating = self.rng.random(n) < self.mutation_prob
        crossed = [int(k) for k in np.nonzero(crossing)[0]]
        children = [self._crossover(parents[k], pop[int(self.rng.choice(len(pop), p=probs))]) for k in crossed]
        for k, child, ok in zip(crossed, children, self._valid(children)):
            if ok:
                out[k] = child  # type: ignore[assignment]
                crossing[k] = False  # done; a failed crossover falls back to a mutation
                stats.crossed += 1
            else:
                stats.crossover_failed += 1
        todo = [int(k) for k in np.nonzero(crossing | (mutating & ~np.isin(np.arange(n), crossed)))[0]]
        for attempt in range(self.max_tries):
            if not todo:
                break
            if attempt:  # failed slots start again from a freshly drawn parent
                for k in todo:
                    parents[k] = out[k] = pop[int(self.rng.choice(len(pop), p=probs))]
            children = [self._mutate(parents[k]) for k in todo]
            failed = []
            for k, child, ok in zip(todo, children, self._valid(children)):
                if ok:
                    out[k] = child  # type: ignore[assignment]
                    stats.mutated += 1
                else:
                    failed.append(k)
                    stats.mutation_failed += 1
            todo = failed
        return elites + out

    # ---- the loop -------------------------------------------------------------------------

    def search(self, init: Sequence[State], num_best: int, exclude: Collection[str] = frozenset()) -> list[State]:
        """The `num_best` best-predicted distinct states met in `generations` generations from `init`,
        best first, leaving out those whose `state_key` is in `exclude` (e.g. already measured)."""
        self.history = []
        pop = list(init)
        if not pop or num_best <= 0:
            return []
        seen: dict[tuple[Step, ...], tuple[float, State]] = {}
        scores = np.empty(0)
        for gen in range(self.generations + 1):
            t0 = time.perf_counter()
            stats = GenerationStats(gen, len(pop), 0.0, 0.0, 0.0)
            if gen:
                pop = self._children(pop, scores, stats)
            scores = self.score(pop)
            for s, v in zip(pop, scores):
                if np.isfinite(v):
                    seen.setdefault(s.steps, (float(v), s))
            valid = scores[np.isfinite(scores)]
            if not valid.size:
                return []
            top = sorted((v for v, _ in seen.values()), reverse=True)[:num_best]
            stats.size, stats.mean_score, stats.max_score = len(pop), float(valid.mean()), float(valid.max())
            stats.best_k_mean, stats.seconds = float(np.mean(top)), time.perf_counter() - t0
            self.history.append(stats)
        best: list[State] = []
        for _, state in sorted(seen.values(), key=lambda e: -e[0]):
            if state_key(state) not in exclude:
                best.append(state)
                if len(best) == num_best:
                    break
        return best
