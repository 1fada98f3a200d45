"""Batch feature extraction for the search, with a per-state cache.

Statements come from `features.nest` (the loop nest derived arithmetically from the steps, ~3x
faster than lowering); states outside its affine fragment are lowered. Evolutionary search re-scores
the same states every generation (the population survives, the best-k set is re-ranked), so
features are cached by (workload key, steps). The steps tuple holds the step JSON's content (frozen,
hashable step records, equal iff their JSON is equal) and hashes in ~2 us where `to_json` takes
~80 us, so a hit costs a few microseconds. States that are not complete programs get a
(0, N_FEATURES) array (cached too); a cost model scores them as invalid.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from tensorgen.errors import TensorgenError
from tensorgen.features.ansor import batch_features
from tensorgen.features.dataflow import dataflow_row
from tensorgen.features.layout import N_FEATURES
from tensorgen.features.nest import program_statements
from tensorgen.schedule.state import State
from tensorgen.target import HardwareParams


def state_key(state: State) -> tuple:
    """Identity of a program: the workload and its replayable steps."""
    return state.dag.workload_key, state.steps


class FeatureExtractor:
    """`extract(states)` -> one (n_statements, N_FEATURES) array per state, cached (LRU, `capacity`); with
    `dataflow`, one more row last: the program's data-flow row (features.dataflow, for PaCM).

    Returned arrays are read-only and shared with the cache, so repeated calls return identical
    objects; copy before modifying. `stats` counts hits/misses/failures and seconds spent lowering
    and computing features.
    """

    def __init__(self, hw: HardwareParams, capacity: int = 200_000, dataflow: bool = False):
        self.hw, self.dataflow = hw, dataflow
        self.capacity = capacity
        self._cache: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.stats = {"hits": 0, "misses": 0, "failures": 0, "added": 0, "lower_s": 0.0, "features_s": 0.0}

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        self._cache.clear()

    def extract(self, states: Sequence[State]) -> list[np.ndarray]:
        """Features of every state; the misses of one call are computed together (one vectorized pass)."""
        out: list[np.ndarray | None] = []
        missing: dict[tuple, list[int]] = {}  # key -> positions in `out` (a batch may repeat a state)
        for state in states:
            key = state_key(state)
            feats = self._cache.get(key)
            if feats is not None:
                self.stats["hits"] += 1
                self._cache.move_to_end(key)
            elif key in missing:
                self.stats["hits"] += 1
                missing[key].append(len(out))
            else:
                missing[key] = [len(out)]
            out.append(feats)
        if missing:
            computed = self._compute([states[pos[0]] for pos in missing.values()])
            for (key, pos), feats in zip(missing.items(), computed):
                self._store(key, feats)
                for p in pos:
                    out[p] = feats
        return out  # type: ignore[return-value]

    def add(self, key: tuple, feats: np.ndarray) -> None:
        """Cache features computed elsewhere (a worker process) under `state_key`'s key."""
        feats.setflags(write=False)
        self.stats["added"] += 1
        self._store(key, feats)

    def _store(self, key: tuple, feats: np.ndarray) -> None:
        self._cache[key] = feats
        if len(self._cache) > self.capacity:
            self._cache.popitem(last=False)

    def extract_one(self, state: State) -> np.ndarray:
        return self.extract([state])[0]

    def _compute(self, states: Sequence[State]) -> list[np.ndarray]:
        t0 = time.perf_counter()
        self.stats["misses"] += len(states)
        programs, valid = [], []
        for state in states:
            try:
                programs.append(program_statements(state))
                valid.append(True)
            except TensorgenError:
                self.stats["failures"] += 1
                programs.append([])
                valid.append(False)
        t1 = time.perf_counter()
        self.stats["lower_s"] += t1 - t0
        out = [f if ok else np.zeros((0, N_FEATURES)) for f, ok in zip(batch_features(programs, self.hw), valid)]
        if self.dataflow:  # the program's data-flow row last (features.dataflow)
            out = [np.vstack([f, dataflow_row(p, self.hw)]) if ok else f for f, p, ok in zip(out, programs, valid)]
        for f in out:
            f.setflags(write=False)
        self.stats["features_s"] += time.perf_counter() - t1
        return out
