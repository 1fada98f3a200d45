"""SketchPolicy: Ansor's search for one task — sketches, random annotation, evolution, a learned model.

Every batch starts from a fresh random sample of the sketches plus the best programs measured so
far (`seed_fraction` of the sample size), evolves it against the cost model and proposes the best
predicted programs, with an eps-greedy share of plain random samples so a wrong model cannot starve
exploration. Programs offered from outside (a similar task's best, adapted by tensorgen.search.transfer)
are measured first and join the seeds. Measurements retrain the model. Nothing is proposed twice: states
already proposed or measured (including those a resumed tuner replays from its database) are excluded by `state_key`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from tensorgen.costmodel.psa import StaticAnalyzer
from tensorgen.costmodel.xgb import XGBModel
from tensorgen.features.extractor import FeatureExtractor
from tensorgen.measure.types import MeasureInput, MeasureResult
from tensorgen.schedule.state import State
from tensorgen.search.annotate import AnnotationPolicy
from tensorgen.search.evolution import EvolutionarySearch
from tensorgen.search.gc_relief import fewer_collections
from tensorgen.search.mutations import Mutation
from tensorgen.search.policy import SearchPolicy, state_key
from tensorgen.search.sketch import generate_sketches
from tensorgen.search.skips import Skips
from tensorgen.task import SearchTask


class SketchPolicy(SearchPolicy):
    """Ansor's sketch policy for `task` (seeded: same seed and measurements, same batches).

    `population`/`generations` size the evolution; `init_population` (default min(population, 256))
    is how many random programs each batch samples — sampling lowers every candidate, so it is the
    cost to keep small. `crossover_prob=0` disables crossover. `workers` processes make the children
    (default: one per core of the task's machine, at most this machine's; 1 = in this process).
    Operations of the search that raise are skipped and counted in `skips` (tensorgen.search.skips).
    """

    def __init__(self, task: SearchTask, cost_model=None, seed: int = 0, population: int = 2048,
                 generations: int = 4, eps_greedy: float = 0.05, seed_fraction: float = 0.2,
                 extractor: FeatureExtractor | None = None, annotation: AnnotationPolicy | None = None,
                 init_population: int | None = None, sketches: Sequence[State] | None = None,
                 mutation_prob: float = 0.85, crossover_prob: float = 0.05,
                 mutations: Sequence[Mutation] | None = None, patience: int = 5, workers: int | None = None,
                 prefilter: StaticAnalyzer | str | None = None, prefilter_pool: int = 4,
                 prefilter_random: float = 0.1, skips: Skips | None = None) -> None:
        self.task = task
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.cost_model = cost_model if cost_model is not None else XGBModel(seed=seed)
        self.extractor = extractor if extractor is not None else FeatureExtractor(task.hw)
        self.annotation = annotation or AnnotationPolicy()
        self.skips = skips if skips is not None else Skips()
        self.sketches = list(sketches) if sketches is not None else generate_sketches(task, skips=self.skips)
        self.eps_greedy, self.seed_fraction, self.patience = eps_greedy, seed_fraction, patience
        self.init_population = init_population if init_population is not None else min(population, 256)
        if prefilter not in (None, "psa") and not isinstance(prefilter, StaticAnalyzer):
            raise ValueError(f"prefilter must be 'psa', a StaticAnalyzer or None, not {prefilter!r}")
        self.prefilter = StaticAnalyzer(task.hw) if prefilter == "psa" else prefilter
        self.prefilter_pool, self.prefilter_random = prefilter_pool, prefilter_random
        self.evolution = EvolutionarySearch(
            task, self.cost_model, self.extractor, self.rng, population=population, generations=generations,
            mutation_prob=mutation_prob, crossover_prob=crossover_prob, sketches=self.sketches,
            mutations=mutations, annotation=self.annotation,
            workers=workers if workers is not None else min(task.hw.cores, os.cpu_count() or 1), skips=self.skips,
        )
        self.seen: set[str] = set()  # keys of states proposed or measured
        self.measured: dict[str, float] = {}  # key -> mean cost (inf for failures)
        self._good: list[tuple[float, int, State]] = []  # (cost, order, state) of successful measurements
        self._offered: list[State] = []  # programs from other tasks, for the next batch
        self.num_trained = 0

    # ---- proposing --------------------------------------------------------------------------

    def best_measured(self, k: int) -> list[State]:
        """The k fastest measured states (the seeds of the next evolution)."""
        self._good.sort(key=lambda e: (e[0], e[1]))
        return [s for _, _, s in self._good[:k]]

    def _fresh(self, states: Sequence[State], k: int, out: list[State], keys: set[str]) -> None:
        """Append up to k states of `states` that were never seen, in order."""
        added = 0
        for s in states:
            if added >= k:
                return
            key = state_key(s)
            if key not in self.seen and key not in keys:
                keys.add(key)
                out.append(s)
                added += 1

    def close(self) -> None:
        """Stop the search's worker processes; the next batch starts them again."""
        self.evolution.close()

    def offer(self, states: Sequence[State]) -> None:
        """Programs of this task made elsewhere (adapted from similar tasks' best, tensorgen.search.transfer):
        the next batch measures up to half of itself from them, in their order, and evolves from all of them."""
        self._offered = list(states)

    def next_batch(self, n: int) -> list[State]:
        with fewer_collections():
            return self._next_batch(n)

    def _next_batch(self, n: int) -> list[State]:
        out: list[State] = []
        keys: set[str] = set()
        offered, self._offered = self._offered, []
        self._fresh(offered, max(n // 2, 1), out, keys)
        idle = 0
        while len(out) < n and idle < self.patience:
            before = len(out)
            need = n - len(out)
            init = self._sample()
            if not init:
                idle += 1
                continue
            seeds = self.best_measured(int(self.seed_fraction * len(init))) + offered
            n_random = min(need, int(round(self.eps_greedy * need)))
            # random scores make evolution a costly shuffle: then the batch is random samples
            best = self.evolution.search(init + seeds, need, exclude=self.seen | keys) \
                if self.cost_model.trained else []
            self._fresh(best, need - n_random, out, keys)
            order = self.rng.permutation(len(init))
            self._fresh([init[int(i)] for i in order], n - len(out), out, keys)  # eps-greedy share
            self._fresh(best, n - len(out), out, keys)  # too few random ones: more of the best
            idle = 0 if len(out) > before else idle + 1
        self.seen |= keys
        return out

    def _sample(self) -> list[State]:
        """The batch's random programs; with a `prefilter` (Pruner's PSA) the best-estimated of
        `prefilter_pool` times as many, and a `prefilter_random` share of the rest (the space PSA prunes
        is kept reachable)."""
        if self.prefilter is None:
            return self.evolution.sample(self.init_population)
        pool = self.evolution.sample(self.init_population * self.prefilter_pool)
        order = np.argsort(self.prefilter.latencies(pool), kind="stable")
        n_best = int(round(self.init_population * (1 - self.prefilter_random)))
        rest = order[n_best:]
        kept = self.rng.choice(rest, min(rest.size, self.init_population - n_best), replace=False)
        return [pool[int(i)] for i in (*order[:n_best], *kept)]

    # ---- learning ---------------------------------------------------------------------------

    def update(self, inputs: list[MeasureInput], results: list[MeasureResult]) -> None:
        """Remember what was measured and retrain the model with it (failures count as throughput 0).

        Only the new measurements are passed: the cost models keep every sample they were given and
        retrain on all of them (XGBModel retrains from scratch on everything at each update).
        """
        if len(inputs) != len(results):
            raise ValueError(f"{len(inputs)} inputs but {len(results)} results")
        if not inputs:
            return
        flop = self.task.dag.flop_count
        throughputs = np.zeros(len(inputs))
        for n, (inp, res) in enumerate(zip(inputs, results)):
            key = state_key(inp.state)
            cost = res.median_cost if res.ok else math.inf  # as the records: robust to one stalled repeat
            self.seen.add(key)
            if key not in self.measured or cost < self.measured[key]:
                self.measured[key] = cost
            if math.isfinite(cost) and cost > 0:
                throughputs[n] = flop / cost
                self._good.append((cost, len(self._good), inp.state))
        features = self.evolution.maker.features([inp.state for inp in inputs])
        with self.skips.guard("cost model update", f"{type(self.cost_model).__name__} on {self.task}"):
            self.cost_model.update(features, throughputs, np.full(len(inputs), self.task.workload_key))
            self.num_trained += len(inputs)

    def __repr__(self) -> str:
        return (f"SketchPolicy({self.task}, seed={self.seed}, {len(self.sketches)} sketches, "
                f"{len(self.measured)} measured, {len(self.seen)} seen)")
