"""Simulated annealing over a ConfigSpace with a model's score as the (negative) energy (AutoTVM §3.3).

A batch of parallel Markov chains walks the space: every step moves each chain to a neighbour (one knob changed)
and accepts the move with probability min(1, exp((new score - score) / T)), the temperature T falling linearly
from `temperature[0]` to `temperature[1]` over `steps`. The best-scored configs seen on the walk that are not
`excluded` (measured or proposed) are kept, `plan_size` of them, and returned best first. The chains persist
across calls (`persistent`), as in AutoTVM: a search resumes where the last one stopped, on the new model. The
defaults are AutoTVM's (SimulatedAnnealingOptimizer: 128 chains, 500 steps, temperature 1 -> 0, stop after 50
steps without a better plan).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container
from dataclasses import dataclass

import numpy as np

from tensorgen.errors import TuneError
from tensorgen.search.autotvm.space import ConfigSpace

Point = tuple[int, ...]


@dataclass(frozen=True)
class AnnealConfig:
    chains: int = 128
    steps: int = 500
    temperature: tuple[float, float] = (1.0, 0.0)
    early_stop: int = 50
    persistent: bool = True

    def __post_init__(self) -> None:
        if self.chains < 1 or self.steps < 0 or self.early_stop < 1 or min(self.temperature) < 0:
            raise TuneError(f"need chains >= 1, steps >= 0, early_stop >= 1 and temperatures >= 0; got {self}")


class SimulatedAnnealing:
    """Annealing over `space` (seeded by `rng`); `search(score, plan_size, excluded)` is one planning."""

    def __init__(self, space: ConfigSpace, rng: np.random.Generator, config: AnnealConfig = AnnealConfig()) -> None:
        self.space, self.rng, self.config = space, rng, config
        self.points: np.ndarray | None = None  # the chains' positions, kept between searches when persistent

    def search(self, score: Callable[[np.ndarray], np.ndarray], plan_size: int,
               excluded: Container[Point] = frozenset()) -> list[Point]:
        """Up to `plan_size` configs (as knob choices) of the best scores met, best first, none of `excluded`."""
        cfg = self.config
        points = self.points if cfg.persistent and self.points is not None else self.space.random(self.rng, cfg.chains)
        scores = score(points)
        heap: list[tuple[float, Point]] = []  # the plan: a min-heap of the best (score, point)
        in_heap: set[Point] = set()
        self._offer(heap, in_heap, points, scores, plan_size, excluded)
        t, cool = cfg.temperature[0], (cfg.temperature[0] - cfg.temperature[1]) / (cfg.steps + 1)
        since_better = 0
        for _ in range(cfg.steps):
            if since_better >= cfg.early_stop:
                break
            moved = self.space.neighbours(points, self.rng)
            moved_scores = score(moved)
            accept = self.rng.random(len(points)) < np.exp(np.minimum((moved_scores - scores) / (t + 1e-5), 0.0))
            points[accept], scores[accept] = moved[accept], moved_scores[accept]
            better = self._offer(heap, in_heap, moved, moved_scores, plan_size, excluded)
            since_better = 0 if better else since_better + 1
            t = max(t - cool, 0.0)
        self.points = points
        return [p for _, p in sorted(heap, reverse=True)]

    @staticmethod
    def _offer(heap: list[tuple[float, Point]], in_heap: set[Point], points: np.ndarray, scores: np.ndarray,
               plan_size: int, excluded: Container[Point]) -> bool:
        """Put the points that beat the plan's worst into it; whether any did."""
        better = False
        for p, s in zip(map(tuple, points.tolist()), scores.tolist()):
            if p in in_heap or p in excluded or (len(heap) >= plan_size and s <= heap[0][0]):
                continue
            if len(heap) >= plan_size:
                in_heap.discard(heapq.heapreplace(heap, (s, p))[1])
            else:
                heapq.heappush(heap, (s, p))
            in_heap.add(p)
            better = True
        return better
