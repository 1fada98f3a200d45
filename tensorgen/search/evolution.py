"""Evolutionary search (Ansor §5.1): fine-tune sampled programs against the learned cost model.

Each generation the cost model scores the population (its predicted throughput is the fitness);
parents are drawn with probability proportional to fitness and each child is a mutation of one
parent (`tensorgen.search.mutations`), a node-based crossover of two, or a copy. The best distinct
programs seen in any generation are returned, so a bad generation never loses a good program.

Selection happens here; the children of a generation are made in one go by `search.children`
(in this process, or by forked workers, one per core: each job carries its own seed, so the result
is the same either way). Children are validated by the feature extractor, whose features the cost
model then scores: validation costs nothing extra.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.errors import TuneError
from tensorgen.features.extractor import FeatureExtractor
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import Step
from tensorgen.search.annotate import AnnotationPolicy
from tensorgen.search.children import ChildJob, ChildMaker, ChildResult, ChildWorkers, SampleJob
from tensorgen.search.mutations import Mutation
from tensorgen.search.policy import state_key
from tensorgen.search.sketch import generate_sketches
from tensorgen.search.skips import Skips
from tensorgen.search.targets import for_target
from tensorgen.task import SearchTask

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


@dataclass(frozen=True)
class EvolutionConfig:
    """The knobs of the evolution (Ansor's defaults).

    A child is a crossover with `crossover_prob` (a mutation if the parents do not cross), else a
    mutation with `mutation_prob`, else a copy of its parent (as in Ansor); `crossover_prob=0` turns
    crossover off so its value can be measured. `elite_fraction` of each population's best are carried
    over unchanged (0 = Ansor: the best-k set alone keeps them). A child whose mutation or crossover fails
    is retried up to `max_tries` times.
    """

    population: int = 2048
    generations: int = 4
    mutation_prob: float = 0.85
    crossover_prob: float = 0.05
    elite_fraction: float = 0.0
    max_tries: int = 4

    def __post_init__(self) -> None:
        if not (0 <= self.mutation_prob <= 1 and 0 <= self.crossover_prob <= 1 and 0 <= self.elite_fraction <= 1):
            raise TuneError("mutation_prob, crossover_prob and elite_fraction are probabilities in [0, 1]")
        if self.population < 1 or self.generations < 0 or self.max_tries < 1:
            raise TuneError(f"need population >= 1, generations >= 0 and max_tries >= 1; got {self}")


class EvolutionarySearch:
    """Evolve a population under `cost_model` and return the best predicted programs (`config`: the
    knobs). Crossover needs the task's `sketches` to know which parents are compatible; `workers`
    processes make the children (1: this process)."""

    def __init__(self, task: SearchTask, cost_model, extractor: FeatureExtractor | None = None,
                 rng: np.random.Generator | None = None, config: EvolutionConfig = EvolutionConfig(), *,
                 sketches: Sequence[State] | None = None, mutations: Sequence[Mutation] | None = None,
                 annotation: AnnotationPolicy | None = None, workers: int = 1, skips: Skips | None = None):
        self.task, self.cost_model, self.config = task, cost_model, config
        self.extractor = extractor if extractor is not None \
            else FeatureExtractor(task.hw, dataflow=cost_model.dataflow)
        self.rng = rng if rng is not None else np.random.default_rng(0)
        if mutations is None:  # the target kind's table, under this policy's knobs
            mutations = for_target(task).mutations
            if annotation is not None:
                mutations = [copy.copy(r) for r in mutations]
                for r in mutations:
                    r.policy = annotation
        if sketches is None:
            sketches = generate_sketches(task, skips=skips)
        self.maker = ChildMaker(task, self.extractor, sketches,
                                mutations, config.max_tries, annotation=annotation, skips=skips)
        self.workers = workers
        self._pool: ChildWorkers | None = None
        self.history: list[GenerationStats] = []

    def close(self) -> None:
        """Stop the worker processes (they also stop when the search is garbage-collected)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # ---- fitness --------------------------------------------------------------------------

    def score(self, states: Sequence[State]) -> np.ndarray:
        """Predicted fitness; -inf for states that do not lower (no statements). A cost model whose prediction
        fails scores every valid state alike (the generation is a random walk) and is counted in the skips."""
        if missing := self.extractor.uncached(states):  # many: the workers compute them
            self._maker(len(missing)).features(missing)
        feats = self.maker.features(states)
        scores = np.zeros(len(states))
        with self.maker.skips.guard("cost model predict", f"{type(self.cost_model).__name__} on {self.task}"):
            scores = np.asarray(self.cost_model.predict(feats), dtype=np.float64).reshape(len(states))
        return np.where([f.shape[0] > 0 for f in feats], scores, -np.inf)

    # ---- children -------------------------------------------------------------------------

    def _maker(self, n_jobs: int) -> ChildMaker | ChildWorkers:
        """This process for small jobs lists; else the workers (forked on first use: they start with
        everything the maker knows)."""
        if self.workers <= 1 or n_jobs < 64:
            return self.maker
        if self._pool is None:
            self._pool = ChildWorkers(self.maker, self.workers)
        return self._pool

    def _make(self, jobs: list[ChildJob], features: bool = True) -> list[ChildResult]:
        return self._maker(len(jobs)).make(jobs, features)

    def sample(self, n: int, max_tries: int | None = None) -> list[State]:
        """`n` valid random programs of the sketches (fewer only if `max_tries`, default 10 n, samples
        mostly fail), sampled in the workers like the children; duplicates are kept."""
        sketches = self.maker.sketches
        if not sketches:
            raise ValueError("sample: no sketches to sample from")
        out: list[State] = []
        tries, limit = 0, 10 * n if max_tries is None else max_tries
        while len(out) < n and tries < limit:
            k = min(n - len(out), limit - tries)
            tries += k
            jobs = [SampleJob(int(s), int(seed)) for s, seed in
                    zip(self.rng.integers(len(sketches), size=k), self.rng.integers(2**63, size=k))]
            out += [self.maker.state(st) for st in self._maker(k).sample(jobs) if st is not None]
        return out

    def _children(self, pop: list[State], scores: np.ndarray, stats: GenerationStats, population: int,
                  features: bool = True) -> list[State]:
        """The next population: parents drawn by fitness, each slot a crossover (else mutation), a
        mutation or a copy; children are made (and validated) for all slots at once, maybe by workers."""
        valid = np.isfinite(scores)
        # shift to positive; the floor keeps the worst valid program selectable
        floor = 1e-3 * float(np.ptp(scores[valid])) + 1e-12
        fit = np.where(valid, scores - scores[valid].min() + floor, 0.0) if valid.any() else np.ones(len(pop))
        probs = fit / fit.sum()
        n_elite = int(self.config.elite_fraction * population)
        elites = [pop[int(i)] for i in np.argsort(-scores, kind="stable")[:n_elite] if valid[i]]
        n = population - len(elites)
        for s in pop:  # the makers' parents: states already built are not replayed
            self.maker.remember(s)
        parents = self.rng.choice(len(pop), size=n, p=probs)
        others = self.rng.choice(len(pop), size=n, p=probs)
        crossing = self.rng.random(n) < self.config.crossover_prob
        mutating = self.rng.random(n) < self.config.mutation_prob
        seeds = self.rng.integers(2**63, size=n)
        out = [pop[int(i)] for i in parents]  # a slot without a valid child keeps its parent
        slots = [k for k in range(n) if crossing[k] or mutating[k]]
        jobs = [ChildJob(out[k].steps, pop[int(others[k])].steps if crossing[k] else None, bool(mutating[k]),
                         int(seeds[k])) for k in slots]
        for k, res in zip(slots, self._make(jobs, features)):
            stats.crossed += res.crossed is True
            stats.crossover_failed += res.crossed is False
            stats.mutated += res.mutated
            stats.mutation_failed += res.mutation_failures
            if res.steps is not None:
                out[k] = self.maker.state(res.steps)
        return elites + out

    # ---- the loop -------------------------------------------------------------------------

    def search(self, init: Sequence[State], num_best: int, exclude: Collection[str] = frozenset(), *,
               score: Callable[[Sequence[State]], np.ndarray] | None = None,
               generations: int | None = None, population: int | None = None,
               features: bool = True) -> list[State]:
        """The `num_best` best-predicted distinct states met in `generations` generations (default the config's)
        from `init`, best first, leaving out those whose `state_key` is in `exclude` (e.g. already measured).
        `score` is the fitness (default: the cost model's, `self.score`; higher is better, -inf invalid);
        `population` the size of each generation after the first (default the config's); `features` false:
        children are valid by the extractor's estimate and get no features (a `score` that reads only the
        estimate, e.g. Pruner's draft)."""
        score = score or self.score
        self.history = []
        pop = list(init)
        if not pop or num_best <= 0:
            return []
        seen: dict[tuple[Step, ...], tuple[float, State]] = {}
        scores = np.empty(0)
        for gen in range((self.config.generations if generations is None else generations) + 1):
            t0 = time.perf_counter()
            stats = GenerationStats(gen, len(pop), 0.0, 0.0, 0.0)
            if gen:
                pop = self._children(pop, scores, stats, population or self.config.population, features)
            scores = score(pop)
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
