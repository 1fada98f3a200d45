"""Ansor's learned cost model (§5.2): gradient-boosted trees over statements with the pack-sum loss.

The tree model f scores single statements; a program's score is the sum over its statements. Training minimizes
    loss = 1/2 * sum_p w_p (sum_{s in p} f(s) - y_p)^2,   y_p = throughput / best throughput of p's task,  w_p = y_p
so the model spends its capacity on the fast programs the search cares about. It is retrained from scratch on
all data seen so far at every update (cheap at tuning-scale data sizes, and avoids drift of incremental boosting).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorgen.costmodel.base import CostModel, CostModelError, normalize_throughput, pack_features

__all__ = ["XGBModel", "pack_sum_loss", "pack_sum_objective", "pack_sum_predict"]

_FORMAT = "tensorgen.costmodel.xgb/1"

if TYPE_CHECKING:  # imported where a model trains or loads: importing xgboost costs ~1 s of CPU, which every
    import xgboost as xgb  # process importing tensorgen paid (each CLI command, each builder worker of a tuning)


def pack_sum_predict(row_preds: np.ndarray, program_ids: np.ndarray, n_programs: int) -> np.ndarray:
    """Program scores = per-row predictions summed per program (empty programs get 0)."""
    return np.bincount(program_ids, weights=row_preds, minlength=n_programs)


def pack_sum_loss(row_preds: np.ndarray, program_ids: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """The weighted pack-sum squared error (with the conventional 1/2, so its gradient is w * residual)."""
    r = pack_sum_predict(row_preds, program_ids, len(y)) - y
    return float(0.5 * np.sum(w * r * r))


def pack_sum_objective(
    row_preds: np.ndarray, program_ids: np.ndarray, y: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-row gradient and (diagonal) hessian of :func:`pack_sum_loss`.

    d loss / d f(s) = w_p * (sum_{s' in p} f(s') - y_p) for every row s of program p, and the second derivative
    is w_p; both are broadcast from the program to its rows.
    """
    r = pack_sum_predict(row_preds, program_ids, len(y)) - y
    return (w * r)[program_ids], np.asarray(w, dtype=np.float64)[program_ids]


class XGBModel(CostModel):
    """Pack-sum XGBoost cost model; random (seeded) scores until ``min_samples`` programs have been measured
    (`path`: start from a saved model)."""

    def __init__(
        self,
        seed: int = 0,
        num_rounds: int = 200,
        min_samples: int = 64,
        nthread: int | None = None,
        max_depth: int = 10,
        eta: float = 0.2,
        xgb_params: dict[str, Any] | None = None,
        path: str | os.PathLike | None = None,
    ) -> None:
        self.seed = seed
        self.num_rounds = num_rounds
        self.min_samples = min_samples
        # one thread by default: the data is small (thousands of rows), and with the cores busy compiling
        # or timing candidates, more threads made one training take 17 s instead of 0.3 s
        self.nthread = nthread or 1
        # min_child_weight=0: hessians are the weights w_p <= 1, a positive minimum would forbid most splits.
        self.params: dict[str, Any] = {
            "tree_method": "hist",
            "max_depth": max_depth,
            "eta": eta,
            "gamma": 0.001,
            "min_child_weight": 0,
            "base_score": 0.0,  # added once per statement, so anything else biases long programs
            "seed": seed,
            "nthread": self.nthread,
            "verbosity": 0,
            "disable_default_eval_metric": 1,
        }
        self.params.update(xgb_params or {})
        self._rng = np.random.default_rng(seed)
        self._features: list[np.ndarray] = []
        self._throughputs: list[np.ndarray] = []
        self._groups: list[np.ndarray] = []
        self._n_features: int | None = None
        self._trained_on = 0
        self._loaded_best: dict[str, float] = {}
        self.booster: xgb.Booster | None = None
        if path is not None:
            self.load(path)

    @property
    def num_samples(self) -> int:
        """Programs held for training (measurements since construction or the last load)."""
        return len(self._features)

    @property
    def trained(self) -> bool:
        return self.booster is not None

    @property
    def task_best_throughput(self) -> dict[str, float]:
        """Best raw throughput per task: the scale that turns a prediction back into FLOP/s."""
        best = dict(self._loaded_best)
        if self._throughputs:
            t = np.concatenate(self._throughputs)
            t = np.where(np.isfinite(t) & (t > 0), t, 0.0)
            keys, inv = np.unique(np.concatenate(self._groups), return_inverse=True)
            m = np.zeros(len(keys))
            np.maximum.at(m, inv.reshape(-1), t)
            for k, v in zip(keys.tolist(), m.tolist()):
                best[k] = max(v, best.get(k, 0.0))
        return best

    def update(self, features: list[np.ndarray], throughputs: np.ndarray, groups: np.ndarray | None = None) -> None:
        """Record the measurements and retrain from scratch on everything seen so far."""
        t = np.asarray(throughputs, dtype=np.float64).reshape(-1)
        if len(features) != len(t):
            raise ValueError(f"{len(features)} feature arrays but {len(t)} throughputs")
        g = np.zeros(len(t), dtype=np.int64) if groups is None else np.asarray(groups).reshape(-1)
        if len(g) != len(t):
            raise ValueError(f"{len(g)} groups but {len(t)} throughputs")
        rows, _ = pack_features(features, self._n_features)  # validates widths before anything is stored
        if rows.shape[0]:
            self._n_features = rows.shape[1]
        self._features.extend(np.asarray(f, dtype=np.float32) for f in features)
        self._throughputs.append(t)
        self._groups.append(g.astype(str))  # task ids may be ints or workload keys; compare as strings
        if self.num_samples >= self.min_samples:
            self._train()

    def _train(self) -> None:
        t = np.concatenate(self._throughputs)
        y = normalize_throughput(t, np.concatenate(self._groups))
        w = y  # Ansor: weight each program by its normalized throughput
        rows, ids = pack_features(self._features, self._n_features)
        if rows.shape[0] == 0 or not np.any(w > 0):
            return  # nothing informative yet (no statements, or every measurement failed)
        import xgboost as xgb

        dtrain = xgb.DMatrix(rows, label=y[ids], nthread=self.nthread)

        def obj(preds: np.ndarray, _: xgb.DMatrix) -> tuple[np.ndarray, np.ndarray]:
            return pack_sum_objective(preds, ids, y, w)

        self.booster = xgb.train(self.params, dtrain, num_boost_round=self.num_rounds, obj=obj)
        self._trained_on = len(y)

    def predict(self, features: list[np.ndarray]) -> np.ndarray:
        """Summed statement scores per program (estimated normalized throughput); random if not yet trained."""
        if self.booster is None:
            return self._rng.random(len(features))
        rows, ids = pack_features(features, self._n_features)
        if rows.shape[0] == 0:
            return np.zeros(len(features))
        row_preds = self.booster.inplace_predict(rows, predict_type="margin")
        return pack_sum_predict(np.asarray(row_preds, dtype=np.float64), ids, len(features))

    def save(self, path: str | os.PathLike) -> None:
        """One JSON file: the booster (xgboost JSON) plus the settings and normalization metadata."""
        meta = {
            "format": _FORMAT,
            "seed": self.seed,
            "num_rounds": self.num_rounds,
            "min_samples": self.min_samples,
            "params": self.params,
            "n_features": self._n_features,
            "trained_on": self._trained_on,
            "task_best_throughput": self.task_best_throughput,
            "booster": None if self.booster is None else self.booster.save_raw("json").decode(),
        }
        with open(path, "w") as f:
            json.dump(meta, f)

    def load(self, path: str | os.PathLike) -> None:
        """Restore a saved model; later updates retrain on measurements given after the load (as in Ansor)."""
        try:
            with open(path) as f:
                meta = json.load(f)
        except OSError as err:
            raise CostModelError(f"{path}: cannot read the model ({err.strerror or err})") from None
        except ValueError:  # not JSON, not text
            meta = None
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            raise CostModelError(f"{path}: not a {_FORMAT} file")
        self.__init__(seed=meta["seed"], num_rounds=meta["num_rounds"], min_samples=meta["min_samples"])
        self.params = dict(meta["params"], nthread=self.nthread)
        self._n_features = meta["n_features"]
        self._trained_on = meta["trained_on"]
        self._loaded_best = {str(k): float(v) for k, v in meta["task_best_throughput"].items()}
        if meta["booster"] is not None:
            import xgboost as xgb

            self.booster = xgb.Booster(params={"nthread": self.nthread})
            self.booster.load_model(bytearray(meta["booster"].encode()))
