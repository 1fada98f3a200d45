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
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from tensorgen.costmodel.analyzers import static_analyzer
from tensorgen.costmodel.xgb import XGBModel
from tensorgen.errors import TuneError
from tensorgen.features.extractor import FeatureExtractor
from tensorgen.measure.types import MeasureInput, MeasureResult
from tensorgen.schedule.state import State
from tensorgen.search.annotate import AnnotationPolicy
from tensorgen.search.evolution import EvolutionarySearch, EvolutionConfig
from tensorgen.search.gc_relief import fewer_collections
from tensorgen.search.mutations import Mutation
from tensorgen.search.policy import SearchPolicy, state_key
from tensorgen.search.rules import SketchRule
from tensorgen.search.sketch import SPACES
from tensorgen.search.skips import Skips
from tensorgen.search.targets import for_target
from tensorgen.task import SearchTask

MIN_GENERATION = 256  # the fewest programs a generation holds (SketchConfig.generation_size)


@dataclass(frozen=True)
class SketchConfig:
    """The knobs of SketchPolicy (Ansor's defaults); `SketchConfig.of(population=512, eps_greedy=0.1)` takes
    the evolution's knobs (EvolutionConfig) and these in one flat set.

    Each generation of a batch's evolution holds `population_per_trial` programs per program the batch measures,
    at least MIN_GENERATION and at most the evolution's `population` (None: always `population`). Ansor evolves 2048
    for each round of 64 measurements, 32 per trial; a model's task rounds measure 16 each, and 2048 for each of
    them made the search most of a model's tuning time (bench/results/search_population_s42.md).

    `init_population` (default min(population, 256)) is how many random programs each batch samples —
    sampling lowers every candidate, so it is the cost to keep small; the best measured programs join them
    as seeds (`seed_fraction` of that number) and `eps_greedy` of each batch are plain random samples. A batch
    stops after `patience` samplings that add nothing new. `workers` processes make the children (default:
    one per core of the task's machine, at most this machine's; 1 = in this process). `prefilter="psa"`
    samples `prefilter_pool` times as many programs and keeps Pruner's static analyzer's best of them, with a
    `prefilter_random` share of the rest.
    """

    evolution: EvolutionConfig = EvolutionConfig()
    eps_greedy: float = 0.05
    seed_fraction: float = 0.2
    init_population: int | None = None
    population_per_trial: int | None = 32
    patience: int = 5
    workers: int | None = None
    prefilter: str | None = None
    prefilter_pool: int = 4
    prefilter_random: float = 0.1
    space: str = "sketch"  # a name of search.sketch.SPACES

    def __post_init__(self) -> None:
        SPACES.get(self.space)  # an unknown space is an error here
        if self.prefilter not in (None, "psa"):
            raise TuneError(f"prefilter must be 'psa' or None, not {self.prefilter!r}")
        if not (0 <= self.eps_greedy <= 1 and 0 <= self.seed_fraction and 0 <= self.prefilter_random <= 1
                and self.patience >= 1 and self.prefilter_pool >= 1
                and (self.population_per_trial is None or self.population_per_trial >= 1)):
            raise TuneError(f"need 0 <= eps_greedy, prefilter_random <= 1, seed_fraction >= 0, patience >= 1, "
                             f"prefilter_pool >= 1 and population_per_trial None or >= 1; got {self}")

    @classmethod
    def of(cls, **knobs: Any) -> SketchConfig:
        """A config from flat knobs: EvolutionConfig's fields go to `evolution`, the rest to this config."""
        evolution = {k: knobs.pop(k) for k in list(knobs) if k in _EVOLUTION_KNOBS}
        unknown = sorted(set(knobs) - {f.name for f in fields(cls)} - {"evolution"})
        if unknown:
            raise TuneError(f"SketchPolicy has no knob {', '.join(map(repr, unknown))}; its knobs: "
                             f"{', '.join(_EVOLUTION_KNOBS + _OWN_KNOBS)}")
        return cls(evolution=replace(knobs.pop("evolution", EvolutionConfig()), **evolution), **knobs)

    def generation_size(self, batch: int) -> int:
        """How many programs each generation of the evolution for a batch of `batch` measurements holds."""
        if self.population_per_trial is None:
            return self.evolution.population
        return min(self.evolution.population, max(MIN_GENERATION, self.population_per_trial * batch))

    @property
    def samples(self) -> int:
        """How many random programs each batch samples."""
        return self.init_population if self.init_population is not None else min(self.evolution.population, 256)


_EVOLUTION_KNOBS = tuple(f.name for f in fields(EvolutionConfig))
_OWN_KNOBS = tuple(f.name for f in fields(SketchConfig) if f.name != "evolution")


class SketchPolicy(SearchPolicy):
    """Ansor's sketch policy for `task` (seeded: same seed and measurements, same batches).

    `config` holds the knobs (SketchConfig); the components — the `sketches` to search (default: those the
    sketch `rules` derive, default DEFAULT_RULES), the `mutations`, the `annotation` policy, the feature
    `extractor` — are the policy's parts. Operations of the search that raise are skipped and counted in
    `skips` (tensorgen.search.skips).
    """

    def __init__(self, task: SearchTask, cost_model=None, seed: int = 0, config: SketchConfig = SketchConfig(), *,
                 sketches: Sequence[State] | None = None, rules: Sequence[SketchRule] | None = None,
                 mutations: Sequence[Mutation] | None = None, annotation: AnnotationPolicy | None = None,
                 extractor: FeatureExtractor | None = None, skips: Skips | None = None) -> None:
        self.task, self.seed, self.config = task, seed, config
        self.rng = np.random.default_rng(seed)
        self.cost_model = cost_model if cost_model is not None else XGBModel(seed=seed)
        self.extractor = extractor if extractor is not None \
            else FeatureExtractor(task.hw, dataflow=self.cost_model.dataflow)
        self.annotation = annotation or for_target(task).annotation()
        self.skips = skips if skips is not None else Skips()
        self.sketches = list(sketches) if sketches is not None \
            else SPACES.create(config.space, task, rules, skips=self.skips)
        self.prefilter = static_analyzer(task) if config.prefilter == "psa" else None
        workers = config.workers if config.workers is not None else min(task.hw.cores, os.cpu_count() or 1)
        self.evolution = EvolutionarySearch(
            task, self.cost_model, self.extractor, self.rng, config.evolution, sketches=self.sketches,
            mutations=mutations, annotation=self.annotation, workers=workers, skips=self.skips)
        self.seen: set[str] = set()  # keys of states proposed or measured
        self.measured: dict[str, float] = {}  # key -> mean cost (inf for failures)
        self._good: list[tuple[float, int, State]] = []  # (cost, order, state) of successful measurements
        self._offered: list[State] = []  # programs from other tasks, for the next batch
        self.num_trained = 0

    @classmethod
    def from_options(cls, task: SearchTask, cost_model=None, seed: int = 0, *, sketches: Sequence[State] | None = None,
                     rules: Sequence[SketchRule] | None = None, mutations: Sequence[Mutation] | None = None,
                     annotation: AnnotationPolicy | None = None, extractor: FeatureExtractor | None = None,
                     skips: Skips | None = None, **knobs: Any) -> SketchPolicy:
        """The policy with its knobs given flat (SketchConfig.of), as `tune(policy_options=...)` passes them."""
        return cls(task, cost_model, seed, SketchConfig.of(**knobs), sketches=sketches, rules=rules,
                   mutations=mutations, annotation=annotation, extractor=extractor, skips=skips)

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
        the next batch measures up to half of itself from them, in the order offered (offers before a batch add
        up), and evolves from all of them."""
        self._offered += states

    def next_batch(self, n: int) -> list[State]:
        with fewer_collections():
            return self._next_batch(n)

    def _next_batch(self, n: int) -> list[State]:
        out: list[State] = []
        keys: set[str] = set()
        offered, self._offered = self._offered, []
        self._fresh(offered, max(n // 2, 1), out, keys)
        idle = 0
        while len(out) < n and idle < self.config.patience:
            before = len(out)
            need = n - len(out)
            init = self._sample()
            if not init:
                idle += 1
                continue
            seeds = self.best_measured(int(self.config.seed_fraction * len(init))) + offered
            n_random = min(need, int(round(self.config.eps_greedy * need)))
            # random scores make evolution a costly shuffle: then the batch is random samples
            best = self.evolution.search(init + seeds, need, exclude=self.seen | keys,
                                         population=self.config.generation_size(n)) \
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
            return self.evolution.sample(self.config.samples)
        pool = self.evolution.sample(self.config.samples * self.config.prefilter_pool)
        order = np.argsort(self.prefilter.latencies(pool), kind="stable")
        n_best = int(round(self.config.samples * (1 - self.config.prefilter_random)))
        rest = order[n_best:]
        kept = self.rng.choice(rest, min(rest.size, self.config.samples - n_best), replace=False)
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
