"""Cost-model quality metrics of Ansor §7.5 (RMSE, R^2, pairwise accuracy, recall@k).

The search only uses the model to rank candidates, so the ranking metrics matter most; RMSE and R^2 are computed
against throughput normalized to the best program of each task (the scale the model is trained on).
"""

from __future__ import annotations

import numpy as np

from tensorgen.costmodel.base import normalize_throughput

__all__ = [
    "evaluate",
    "evaluate_at_ks",
    "metric_names",
    "pairwise_accuracy",
    "r2_score",
    "recall_at_k",
    "rmse",
    "summarize_folds",
]


def _pair(y_true: np.ndarray, y_pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(y_true, dtype=np.float64).reshape(-1)
    p = np.asarray(y_pred, dtype=np.float64).reshape(-1)
    if t.shape != p.shape:
        raise ValueError(f"y_true has {t.size} values, y_pred {p.size}")
    return t, p


def pairwise_accuracy(
    y_true: np.ndarray, y_pred: np.ndarray, groups: np.ndarray | None = None, chunk: int = 2048
) -> float:
    """Fraction of pairs with different true values whose order the prediction gets right (ties count 1/2).

    Random guessing scores 0.5. With ``groups`` only pairs within the same task are compared. O(n^2) work in
    row chunks so memory stays at chunk * n.
    """
    t, p = _pair(y_true, y_pred)
    g = None if groups is None else np.unique(np.asarray(groups).reshape(-1), return_inverse=True)[1].reshape(-1)
    correct = total = 0.0
    for lo in range(0, t.size, chunk):
        hi = min(lo + chunk, t.size)
        dt = np.sign(t[lo:hi, None] - t[None, :])
        dp = np.sign(p[lo:hi, None] - p[None, :])
        valid = dt != 0
        if g is not None:
            valid &= g[lo:hi, None] == g[None, :]
        total += valid.sum()
        correct += ((dt == dp) & valid).sum() + 0.5 * ((dp == 0) & valid).sum()
    return float(correct / total) if total else float("nan")


def recall_at_k(y_true: np.ndarray, y_pred: np.ndarray, k: int = 10) -> float:
    """|top-k by truth ∩ top-k by prediction| / k (Ansor footnote 1); random guessing scores about k / n."""
    t, p = _pair(y_true, y_pred)
    k = min(k, t.size)
    if k <= 0:
        return float("nan")
    top_t = np.argsort(-t, kind="stable")[:k]
    top_p = np.argsort(-p, kind="stable")[:k]
    return float(np.intersect1d(top_t, top_p).size / k)


def rmse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    t, p = _pair(y_true, y_pred)
    return float(np.sqrt(np.mean((t - p) ** 2))) if t.size else float("nan")


def r2_score(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Coefficient of determination 1 - SS_res / SS_tot (1 is perfect, 0 is predicting the mean)."""
    t, p = _pair(y_true, y_pred)
    ss_tot = np.sum((t - t.mean()) ** 2) if t.size else 0.0
    return float(1.0 - np.sum((t - p) ** 2) / ss_tot) if ss_tot > 0 else float("nan")


def evaluate(
    throughputs: np.ndarray, predictions: np.ndarray, groups: np.ndarray | None = None, k: int = 10
) -> dict[str, float]:
    """All four metrics; true throughputs are normalized per task to the best one in this set, as in §7.5."""
    y = normalize_throughput(throughputs, groups)
    _, p = _pair(y, predictions)
    return {
        "rmse": rmse(y, p),
        "r2": r2_score(y, p),
        "pairwise_accuracy": pairwise_accuracy(y, p, groups),
        f"recall@{k}": recall_at_k(y, p, k),
    }


def metric_names(ks: tuple[int, ...] = (10,)) -> list[str]:
    """The keys :func:`evaluate_at_ks` returns, in display order."""
    return ["pairwise_accuracy", *(f"recall@{k}" for k in ks), "rmse", "r2"]


def evaluate_at_ks(
    throughputs: np.ndarray, predictions: np.ndarray, groups: np.ndarray | None = None, ks: tuple[int, ...] = (10,)
) -> dict[str, float]:
    """:func:`evaluate` with recall@k for several k (same per-task normalization to the best of this set)."""
    if not ks:
        raise ValueError("need at least one k")
    out = evaluate(throughputs, predictions, groups, k=ks[0])
    y = normalize_throughput(throughputs, groups)
    for k in ks[1:]:
        out[f"recall@{k}"] = recall_at_k(y, predictions, k)
    return out


def summarize_folds(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Mean and (population) standard deviation over folds of every numeric key, NaN-aware.

    Returns ``{"mean": {key: ...}, "std": {key: ...}}``; keys missing from some folds are averaged over the folds
    that have them, and a key that is NaN in every fold stays NaN.
    """
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k, v in row.items() if k not in keys and isinstance(v, (int, float, np.number)))
    mean: dict[str, float] = {}
    std: dict[str, float] = {}
    for key in keys:
        vals = np.array([float(r[key]) for r in rows if key in r], dtype=np.float64)
        finite = vals[np.isfinite(vals)]
        mean[key] = float(finite.mean()) if finite.size else float("nan")
        std[key] = float(finite.std()) if finite.size else float("nan")
    return {"mean": mean, "std": std}
