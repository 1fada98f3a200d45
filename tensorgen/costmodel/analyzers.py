"""Which static analyzer (Pruner's PSA) reads a target kind's programs: declared per kind."""

from __future__ import annotations

from tensorgen.costmodel.psa import Analyzer, StaticAnalyzer
from tensorgen.costmodel.psa_gpu import GpuStaticAnalyzer
from tensorgen.task import SearchTask

#: target kind -> the analyzer of its programs (costmodel.psa's for CPUs, costmodel.psa_gpu's for CUDA kernels)
ANALYZERS: dict[str, type[Analyzer]] = {"cpu": StaticAnalyzer, "cuda": GpuStaticAnalyzer}


def static_analyzer(task: SearchTask) -> Analyzer:
    """The static analyzer of `task`'s programs on its hardware."""
    return ANALYZERS[task.target.kind](task.hw)
