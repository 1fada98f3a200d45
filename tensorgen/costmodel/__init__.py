"""Cost models: the protocol the search ranks candidates with, a random baseline, and Ansor's pack-sum XGBoost."""

from tensorgen.costmodel.base import CostModel, RandomModel, normalize_throughput, pack_features
from tensorgen.costmodel.metrics import evaluate, pairwise_accuracy, r2_score, recall_at_k, rmse

__all__ = [
    "CostModel",
    "RandomModel",
    "XGBModel",
    "evaluate",
    "normalize_throughput",
    "pack_features",
    "pairwise_accuracy",
    "r2_score",
    "recall_at_k",
    "rmse",
]


def __getattr__(name: str):
    # xgboost is imported only when the XGBoost model is asked for, so the rest works without it.
    if name == "XGBModel":
        from tensorgen.costmodel.xgb import XGBModel

        return XGBModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
