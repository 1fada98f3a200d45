"""Pruner's draft-then-verify search (Pruner §2.2-2.3) for one task: the static analyzer drafts, the learned cost
model verifies.

Every `draft_every` batches (and whenever the draft runs dry) an evolutionary search scored by the parameterized
static analyzer alone (costmodel.psa: a formula, nothing to train) explores the space from random programs and the
best measured ones and keeps its `potential` best programs (the paper's target space, 512). Each batch the learned
cost model then verifies: one generation (`verify_generations`) of the evolution over the unmeasured part of the
potential space, a `verify_random` share of fresh random programs and the best measured programs, and the batch is
the best predicted of what it met, with an `eps_greedy` share (the paper: 0.1) of plain random programs so that the
space the analyzer prunes stays reachable. Before the cost model has learned anything (`trained` false) the batch
is the potential space in the analyzer's order.

Everything else (sketches, annotation, mutations, the cost model's training, offers from similar tasks, resume) is
Ansor's search, SketchPolicy, whose knobs are taken flat alongside these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from tensorgen.costmodel.analyzers import static_analyzer
from tensorgen.errors import TuneError
from tensorgen.features.extractor import FeatureExtractor
from tensorgen.schedule.state import State
from tensorgen.search.policy import state_key
from tensorgen.search.sketch_policy import SketchConfig, SketchPolicy
from tensorgen.task import SearchTask


@dataclass(frozen=True)
class DraftConfig:
    """The knobs of the draft and the verification (module docstring): the paper's potential space, verification
    and eps-greedy; a draft of 2 generations of 1024 programs (4 of 2048, Ansor's evolution, cost as much as
    measuring a batch here: making children, not scoring them, is what the search pays for on this CPU), but a
    task's first draft is the analyzer's best of the random sample alone (its warm-up round picks a few programs:
    MobileNet-V2's took 0.57-0.63x of the time to the same estimate, bench/results/pruner_s28.md)."""

    potential: int = 512  # programs the analyzer's search keeps (the target space)
    draft_every: int = 4  # batches between drafts
    draft_generations: int = 2  # of the analyzer's evolutionary search
    draft_population: int = 1024  # its generations' size (at most the evolution's population)
    verify_generations: int = 1  # of the cost model's
    verify_random: float = 0.25  # random programs joining the verification, as a share of `potential`
    verify_population: int | None = None  # its generations' size (None: as many as it starts from, at most the
    # evolution's population)
    first_generations: int | None = 0  # of a task's first draft (0: the analyzer's best of the random sample;
    # None: draft_generations); a cheaper one makes the warm-up round cheaper, and the next batch drafts in full

    def __post_init__(self) -> None:
        if not (self.potential >= 1 and self.draft_every >= 1 and self.draft_generations >= 0
                and self.draft_population >= 1 and self.verify_generations >= 0 and self.verify_random >= 0
                and (self.verify_population is None or self.verify_population >= 1)
                and (self.first_generations is None or self.first_generations >= 0)):
            raise TuneError(f"need potential >= 1, draft_every >= 1, draft_generations >= 0, draft_population >= 1, "
                            f"verify_generations >= 0, verify_random >= 0, verify_population None or >= 1 and "
                            f"first_generations None or >= 0; got {self}")


_DRAFT_KNOBS = tuple(f.name for f in fields(DraftConfig))


class StaticScore:
    """The analyzer's fitness of programs: 1 / estimated latency (-inf: not a program). The extractor computes the
    estimate with each program's features (in the search workers, from the statements it lowers for them) and
    caches it."""

    def __init__(self, extractor: FeatureExtractor) -> None:
        self.extractor = extractor

    def __call__(self, states: Sequence[State]) -> np.ndarray:
        latency = self.extractor.estimates(states)
        ok = np.isfinite(latency) & (latency > 0)
        return np.where(ok, 1.0 / np.where(ok, latency, 1.0), -np.inf)


class PrunerPolicy(SketchPolicy):
    """Pruner's search of `task` (module docstring): `draft` holds the draft's and the verification's knobs,
    `config` Ansor's (its `eps_greedy` is the random share of each batch)."""

    def __init__(self, task: SearchTask, cost_model=None, seed: int = 0, config: SketchConfig | None = None,
                 draft: DraftConfig = DraftConfig(), *, extractor: FeatureExtractor | None = None,
                 **parts: Any) -> None:
        if extractor is None:
            dataflow = cost_model.dataflow if cost_model is not None else False
            analyzer = static_analyzer(task)
            extractor = FeatureExtractor(task.hw, dataflow=dataflow, estimate=analyzer.program_latencies)
        elif extractor.estimate is None:
            raise TuneError("PrunerPolicy needs an extractor with the static analyzer's estimate "
                            "(FeatureExtractor(..., estimate=static_analyzer(task).program_latencies)) or none")
        super().__init__(task, cost_model, seed, config or SketchConfig(eps_greedy=0.1), extractor=extractor,
                         **parts)
        self.draft = draft
        self.static = StaticScore(self.extractor)
        self.potential: list[State] = []  # the latest draft, best first
        self.batches = 0
        self.drafts = 0
        self.redraft = False  # the latest draft was a cheaper first one: the next batch drafts in full

    @classmethod
    def from_options(cls, task: SearchTask, cost_model=None, seed: int = 0, **options: Any) -> PrunerPolicy:
        """The policy with its knobs flat: DraftConfig's, SketchConfig's (eps_greedy 0.1 unless given, as in the
        paper), and SketchPolicy's parts (sketches, rules, ...)."""
        draft = DraftConfig(**{k: options.pop(k) for k in list(options) if k in _DRAFT_KNOBS})
        policy = super().from_options(task, cost_model, seed, **{"eps_greedy": 0.1, **options})
        policy.draft = draft
        return policy

    def _draft(self, offered: Sequence[State]) -> None:
        """A new potential space: the analyzer's best programs met by an evolution from random and the best
        measured programs (a task's first: `first_generations` of it; if fewer, the next batch drafts again)."""
        init = self._sample()
        seeds = self.best_measured(int(self.config.seed_fraction * len(init))) + list(offered)
        population = min(self.draft.draft_population, self.config.evolution.population)
        first = self.draft.first_generations
        generations = first if first is not None and not self.drafts else self.draft.draft_generations
        self.potential = self.evolution.search(init + seeds, self.draft.potential, exclude=self.seen,
                                               score=self.static, generations=generations,
                                               population=population, features=False)
        self.drafts += 1
        self.redraft = generations < self.draft.draft_generations

    def _next_batch(self, n: int) -> list[State]:
        out: list[State] = []
        keys: set[str] = set()
        offered, self._offered = self._offered, []
        self._fresh(offered, max(n // 2, 1), out, keys)
        for _ in range(self.config.patience):
            if len(out) >= n:
                break
            pool = self._unseen(self.potential, keys)
            if self.batches % self.draft.draft_every == 0 or len(pool) < n - len(out) or self.redraft:
                self._draft(offered)
                pool = self._unseen(self.potential, keys)
            self.batches += 1
            need = n - len(out)
            randoms = self.evolution.sample(max(1, int(self.draft.verify_random * self.draft.potential)))
            n_random = min(need, int(round(self.config.eps_greedy * need)))
            if self.cost_model.trained:
                init = pool + randoms + self.best_measured(int(self.config.seed_fraction * len(pool)))
                population = min(self.draft.verify_population or len(init), self.config.evolution.population)
                best = self.evolution.search(init, need, exclude=self.seen | keys,
                                             generations=self.draft.verify_generations, population=population)
            else:  # nothing learned yet: the analyzer's order
                best = pool
            self._fresh(best, need - n_random, out, keys)
            self._fresh(randoms, n - len(out), out, keys)  # eps-greedy share
            self._fresh(best, n - len(out), out, keys)  # too few random ones: more of the best
        self.seen |= keys
        return out

    def _unseen(self, states: Sequence[State], keys: set[str]) -> list[State]:
        return [s for s in states if (k := state_key(s)) not in self.seen and k not in keys]

    def __repr__(self) -> str:
        return (f"PrunerPolicy({self.task}, seed={self.seed}, {len(self.sketches)} sketches, "
                f"{len(self.measured)} measured, {len(self.potential)} in the potential space)")
