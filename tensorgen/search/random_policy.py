"""RandomPolicy: random annotation of the sketches, nothing learned.

It is the search without evolution or a cost model — Ansor's "no fine-tuning" ablation and the
baseline every smarter policy must beat. Like every SearchPolicy it never proposes a program twice:
states already proposed or measured (including those replayed from a database) are skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from tensorgen.costmodel.base import CostModel
from tensorgen.measure.types import MeasureInput, MeasureResult
from tensorgen.schedule.state import State
from tensorgen.search.annotate import AnnotationPolicy, sample_initial_population
from tensorgen.search.policy import SearchPolicy, state_key
from tensorgen.search.sketch import SPACES
from tensorgen.search.skips import Skips
from tensorgen.search.targets import for_target
from tensorgen.task import SearchTask


class RandomPolicy(SearchPolicy):
    """Uniformly sampled complete programs of `task` (seeded: same seed, same sequence of batches).

    `patience` is how many consecutive sampling rounds may bring nothing new before `next_batch`
    gives up and returns fewer than asked: a small search space runs out, and an empty batch tells
    the tuner so. It learns nothing: `cost_model` (given to every registered policy) is not used.
    """

    def __init__(self, task: SearchTask, seed: int = 0, sketches: Sequence[State] | None = None,
                 annotation: AnnotationPolicy | None = None, patience: int = 5, skips: Skips | None = None,
                 cost_model: CostModel | None = None, space: str = "sketch") -> None:
        self.task = task
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.skips = skips if skips is not None else Skips()
        self.sketches = list(sketches) if sketches is not None else SPACES.create(space, task, skips=self.skips)
        self.search = for_target(task)
        self.annotation = annotation or self.search.annotation()
        self.patience = patience
        self.seen: set[str] = set()  # keys of states proposed or measured

    def next_batch(self, n: int) -> list[State]:
        out: list[State] = []
        idle = 0
        while len(out) < n and idle < self.patience:
            population = sample_initial_population(self.task, self.sketches, n - len(out), self.rng, self.annotation,
                                                   validate=partial(self.search.validate, self.task),
                                                   skips=self.skips, sample=self.search.sample)
            fresh = 0
            for state in population:
                key = state_key(state)
                if key not in self.seen:
                    self.seen.add(key)
                    out.append(state)
                    fresh += 1
            idle = 0 if fresh else idle + 1
        return out

    def update(self, inputs: list[MeasureInput], results: list[MeasureResult]) -> None:
        """Nothing to learn; only remember what was measured so it is never proposed."""
        self.seen.update(state_key(inp.state) for inp in inputs)

    def __repr__(self) -> str:
        return f"RandomPolicy({self.task}, seed={self.seed}, {len(self.sketches)} sketches, {len(self.seen)} seen)"
