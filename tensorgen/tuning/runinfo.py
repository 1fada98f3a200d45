"""What a tuning call writes about itself into the database's `runs` table (records.history.Run.info): enough for
the tuning report to name every task and, for models, to add up the estimated end-to-end latency without loading
the model again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensorgen.records.history import command_line
from tensorgen.task import SearchTask
from tensorgen.version import __version__


def _common(kind: str, tasks: Sequence[SearchTask], trials: int, policy: object) -> dict[str, Any]:
    first = tasks[0]
    return {"command": command_line(), "version": __version__, "kind": kind, "trials": trials,
            "policy": policy if isinstance(policy, str) else type(policy).__name__,
            "target": str(first.target), "hw": first.hw.to_dict(),
            "tasks": {t.workload_key: t.desc for t in tasks}}


def operator_run(task: SearchTask, trials: int, policy: object) -> dict[str, Any]:
    """The run of one task's `tune()`."""
    return {**_common("operator", [task], trials, policy), "name": task.desc or task.workload_key}


def model_run(tasks: Sequence[SearchTask], models: dict[str, list[tuple[str, float]]], trials: int, policy: object,
              strategy: str) -> dict[str, Any]:
    """The run of a task scheduler: `models` maps each model's name to its (workload key, weight) pairs."""
    return {**_common("model", tasks, trials, policy), "name": ", ".join(models), "strategy": strategy,
            "models": {name: [[key, weight] for key, weight in pairs] for name, pairs in models.items()}}
