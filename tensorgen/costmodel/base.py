"""The cost-model protocol the search talks to, and the random baseline.

A program is described by a 2-D float32 array of shape (n_statements, n_features), one row per innermost
statement (Ansor §5.2). Models score whole programs; a higher score means a faster program.
"""

from __future__ import annotations

import json
import os
from typing import Protocol, runtime_checkable

import numpy as np

from tensorgen.errors import TensorgenError

__all__ = ["CostModel", "CostModelError", "RandomModel", "normalize_throughput", "pack_features"]


class CostModelError(TensorgenError, ValueError):
    """A saved model that cannot be read: a missing file, another format."""


@runtime_checkable
class CostModel(Protocol):
    """What the search needs from a cost model: learn from measurements, rank candidates, persist.

    Made by a factory registered in tensorgen.tuning.registry.COST_MODELS, called as `factory(seed=...)`.
    Subclass this protocol to inherit the defaults of `trained` and `dataflow`."""

    @property
    def trained(self) -> bool:
        """Whether the scores carry information yet: while they are random the search samples instead of
        evolving against noise, as TVM's SketchPolicy does with a random model. The default: always."""
        return True

    @property
    def dataflow(self) -> bool:
        """Whether the model reads each program's data-flow row (features.dataflow), which the feature extractor
        then appends as the program's last row. The default: no."""
        return False

    def update(self, features: list[np.ndarray], throughputs: np.ndarray, groups: np.ndarray | None = None) -> None:
        """Add measured programs (throughput = flop / seconds; 0 for failures); ``groups`` are task ids."""
        ...

    def predict(self, features: list[np.ndarray]) -> np.ndarray:
        """One float64 score per program, higher is better (only the order is meaningful)."""
        ...

    def save(self, path: str | os.PathLike) -> None: ...

    def load(self, path: str | os.PathLike) -> None: ...


def normalize_throughput(throughputs: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Divide each throughput by the best one of its task, giving values in [0, 1].

    Throughputs of different tasks differ by orders of magnitude; one model serves all tasks only if labels are
    made comparable. Non-finite or negative values (failed measurements) become 0; a task whose best is 0 stays 0.
    """
    y = np.asarray(throughputs, dtype=np.float64).reshape(-1)
    y = np.where(np.isfinite(y) & (y > 0), y, 0.0)
    if groups is None:
        best = y.max(initial=0.0)
        return y / best if best > 0 else np.zeros_like(y)
    g = np.asarray(groups).reshape(-1)
    if g.shape != y.shape:
        raise ValueError(f"groups has shape {g.shape}, throughputs {y.shape}")
    _, inv = np.unique(g, return_inverse=True)
    inv = inv.reshape(-1)
    best = np.zeros(int(inv.max(initial=-1)) + 1)
    np.maximum.at(best, inv, y)
    denom = best[inv]
    return np.divide(y, denom, out=np.zeros_like(y), where=denom > 0)


def pack_features(features: list[np.ndarray], n_features: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Stack per-program statement rows into one matrix; return (rows, program_id_per_row).

    Boosted trees learn per statement, so programs are flattened; the row -> program map lets the loss and the
    prediction sum statements back into programs (programs with no statements score 0).
    """
    arrays = [np.asarray(f, dtype=np.float32) for f in features]
    for i, a in enumerate(arrays):
        if a.ndim != 2:
            raise ValueError(f"program {i}: features must be 2-D (n_statements, n_features), got shape {a.shape}")
    widths = {a.shape[1] for a in arrays if a.shape[0] > 0}
    if n_features is not None:
        widths.add(n_features)
    if len(widths) > 1:
        raise ValueError(f"inconsistent feature widths {sorted(widths)}")
    width = widths.pop() if widths else 0
    counts = np.fromiter((a.shape[0] for a in arrays), dtype=np.int64, count=len(arrays))
    rows = np.concatenate(arrays, axis=0) if int(counts.sum()) else np.zeros((0, width), np.float32)
    return rows, np.repeat(np.arange(len(arrays)), counts)


class RandomModel(CostModel):
    """Uniform random scores: the zero-information baseline and the search's cold start."""

    trained = False  # the search samples instead of evolving against noise

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def update(self, features: list[np.ndarray], throughputs: np.ndarray, groups: np.ndarray | None = None) -> None:
        """Nothing to learn."""

    def predict(self, features: list[np.ndarray]) -> np.ndarray:
        return self._rng.random(len(features))

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump({"format": "tensorgen.costmodel.random/1", "seed": self.seed}, f)

    def load(self, path: str | os.PathLike) -> None:
        with open(path) as f:
            meta = json.load(f)
        self.__init__(int(meta["seed"]))
