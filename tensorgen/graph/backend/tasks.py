"""Tuning tasks of a model: one SearchTask per distinct subgraph, weighted by how often it occurs."""

from __future__ import annotations

from dataclasses import dataclass

from tensorgen.graph.backend.model_target import model_target
from tensorgen.graph.ir import Graph
from tensorgen.graph.passes.fusion import Partition, partition
from tensorgen.hardware import hardware_for
from tensorgen.target import HardwareParams, Target
from tensorgen.task import SearchTask


@dataclass(frozen=True)
class ModelTask:
    task: SearchTask
    weight: int  # occurrences in the model
    subgraphs: tuple[str, ...]  # names of the subgraphs it stands for


def extract_tasks(model: Graph | Partition, target: str | Target = "cpu",
                  hw: HardwareParams | None = None) -> list[ModelTask]:
    """Distinct subgraphs of `model` as tasks, in order of first occurrence (a graph partitioned as a build for
    `target` partitions it: model_target)."""
    target = Target.parse(target)
    part = model if isinstance(model, Partition) else partition(model, model_target(target).channels_last)
    hw = hw if hw is not None else hardware_for(target)
    found: dict[str, list] = {}
    for sub in part.subgraphs:
        entry = found.setdefault(sub.workload_key, [sub, []])
        entry[1].append(sub.name)
    return [
        ModelTask(SearchTask(sub.dag, target, hw, desc=sub.name.rsplit("_", 1)[0]), len(names), tuple(names))
        for sub, names in found.values()
    ]
