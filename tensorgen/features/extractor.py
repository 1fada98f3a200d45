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
from collections.abc import Callable, Sequence

import numpy as np

from tensorgen.errors import TensorgenError
from tensorgen.features.ansor import batch_features
from tensorgen.features.dataflow import dataflow_row
from tensorgen.features.layout import N_FEATURES
from tensorgen.features.nest import program_statements
from tensorgen.features.statement import Statement
from tensorgen.schedule.state import State
from tensorgen.target import HardwareParams

# a number per program from its statements, for many programs at once (None: not a program -> inf), e.g. the
# latency Pruner's static analyzer estimates (costmodel.psa.StaticAnalyzer.program_latencies)
ProgramEstimate = Callable[[Sequence[Sequence[Statement] | None]], np.ndarray]


def state_key(state: State) -> tuple:
    """Identity of a program: the workload and its replayable steps."""
    return state.dag.workload_key, state.steps


class FeatureExtractor:
    """`extract(states)` -> one (n_statements, N_FEATURES) array per state, cached (LRU, `capacity`); with
    `dataflow`, one more row last: the program's data-flow row (features.dataflow, for PaCM). With `estimate`
    (ProgramEstimate), every program's estimate is computed from the same statements and cached alongside its
    features (`estimates(states)`): a search that drafts with a static analyzer lowers each program once, in
    whichever process made it. On a GPU's `hw` (HardwareParams.is_gpu) the programs are a CUDA target's (GPU
    bindings, shared and local buffers).

    Returned arrays are read-only and shared with the cache, so repeated calls return identical
    objects; copy before modifying. `stats` counts hits/misses/failures and seconds spent lowering
    and computing features.
    """

    def __init__(self, hw: HardwareParams, capacity: int = 200_000, dataflow: bool = False,
                 estimate: ProgramEstimate | None = None):
        self.hw, self.dataflow, self.estimate = hw, dataflow, estimate
        self.capacity = capacity
        self._cache: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._estimates: OrderedDict[tuple, float] = OrderedDict()  # with `estimate`: its value per program
        self.stats = {"hits": 0, "misses": 0, "failures": 0, "added": 0, "estimates": 0, "lower_s": 0.0,
                      "features_s": 0.0}

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        self._cache.clear()
        self._estimates.clear()

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
            computed, estimates = self._compute([states[pos[0]] for pos in missing.values()])
            for (key, pos), feats, estimate in zip(missing.items(), computed, estimates):
                self._store(key, feats, estimate)
                for p in pos:
                    out[p] = feats
        return out  # type: ignore[return-value]

    def estimates(self, states: Sequence[State]) -> np.ndarray:
        """`estimate` of every state (inf: not a program), cached; where not cached, from the statements alone
        (no features: a search scored by the estimate never needs most programs' features)."""
        if self.estimate is None:
            raise ValueError("this extractor was made without an estimate")
        keys = [state_key(s) for s in states]
        found = {k: v for k in keys if (v := self._estimates.get(k)) is not None}
        missing = {k: s for k, s in zip(keys, states) if k not in found}
        if missing:
            t0 = time.perf_counter()
            programs = [self._statements(s) for s in missing.values()]
            self.stats["estimates"] += len(programs)
            for key, v in zip(missing, self.estimate(programs)):
                found[key] = float(v)
                self.add_estimate(key, float(v))
            self.stats["lower_s"] += time.perf_counter() - t0
        return np.array([found[k] for k in keys])

    def add_estimate(self, key: tuple, estimate: float) -> None:
        """Cache an estimate computed elsewhere (a worker process) under `state_key`'s key."""
        self._estimates[key] = estimate
        self._estimates.move_to_end(key)
        if len(self._estimates) > self.capacity:
            self._estimates.popitem(last=False)

    def uncached(self, states: Sequence[State]) -> list[State]:
        """The distinct states among `states` whose features are not cached."""
        out: dict[tuple, State] = {}
        for state in states:
            if (key := state_key(state)) not in self._cache:
                out.setdefault(key, state)
        return list(out.values())

    def estimate_of(self, key: tuple) -> float | None:
        """The cached estimate of the program with `state_key` `key` (None: not cached)."""
        return self._estimates.get(key)

    def add(self, key: tuple, feats: np.ndarray, estimate: float | None = None) -> None:
        """Cache features (and the estimate) computed elsewhere (a worker process) under `state_key`'s key."""
        feats.setflags(write=False)
        self.stats["added"] += 1
        self._store(key, feats, estimate)

    def _store(self, key: tuple, feats: np.ndarray, estimate: float | None) -> None:
        self._cache[key] = feats
        if estimate is not None and self.estimate is not None:
            self.add_estimate(key, estimate)
        if len(self._cache) > self.capacity:
            self._cache.popitem(last=False)

    def _statements(self, state: State) -> Sequence[Statement] | None:
        try:
            return program_statements(state, gpu=self.hw.is_gpu)
        except TensorgenError:
            self.stats["failures"] += 1
            return None

    def extract_one(self, state: State) -> np.ndarray:
        return self.extract([state])[0]

    def _compute(self, states: Sequence[State]) -> tuple[list[np.ndarray], list[float | None]]:
        t0 = time.perf_counter()
        self.stats["misses"] += len(states)
        lowered = [self._statements(state) for state in states]
        programs, valid = [p if p is not None else [] for p in lowered], [p is not None for p in lowered]
        t1 = time.perf_counter()
        self.stats["lower_s"] += t1 - t0
        out = [f if ok else np.zeros((0, N_FEATURES)) for f, ok in zip(batch_features(programs, self.hw), valid)]
        if self.dataflow:  # the program's data-flow row last (features.dataflow)
            out = [np.vstack([f, dataflow_row(p, self.hw)]) if ok else f for f, p, ok in zip(out, programs, valid)]
        for f in out:
            f.setflags(write=False)
        estimates: list[float | None] = [None] * len(out)
        if self.estimate is not None:
            estimates = [float(v) for v in self.estimate(lowered)]
        self.stats["features_s"] += time.perf_counter() - t1
        return out, estimates
