"""What a model build does differently per kind of target (MODEL_TARGETS), declared in one place.

A CPU model: convolutions channels-last (graph.passes.layout: the channels are the vector axis), the thread
partitions of consecutive kernels aligned (align.py, for the module's thread pool), records that lay out their
kernels' arguments followed (ALT, layouts.py), tensors in host memory.

A CUDA model: the graph's own layout (NCHW: the channels-last rewrite is about a CPU's vector registers, and on a
GPU it would only add transposes around every conv), no partition alignment (a GPU has no thread pool whose
cores keep what they wrote), no layouts of records (ALT's layouts and the conversion kernels they need are
planned and priced for CPU caches; such records are passed over), kernels without a record bound to blocks of
threads, tensors in device memory (executor_memory.DEVICE).

`extract_tasks` partitions a model as its build does, so a target's records are found by the build.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorgen.graph.backend.default_schedule import DefaultSchedule, default_schedule, gpu_default_schedule
from tensorgen.graph.backend.executor_memory import DEVICE, HOST, Memory
from tensorgen.target import Target


@dataclass(frozen=True)
class ModelTarget:
    """How a model is built for one kind of target."""

    channels_last: bool  # convolutions rewritten to channels-last before the partition
    aligns_partitions: bool  # consecutive kernels' parallel loops aligned (align.align_partitions)
    follows_layouts: bool  # records that lay out their kernel's arguments may be used (build_model's `layouts`)
    schedule: DefaultSchedule  # the program of a kernel without a record
    memory: Memory  # where the executor keeps the tensors
    source: str  # the file name of the model's source in the build directory


#: target kind -> how its models are built
MODEL_TARGETS: dict[str, ModelTarget] = {
    "cpu": ModelTarget(True, True, True, default_schedule, HOST, "model.c"),
    "cuda": ModelTarget(False, False, False, gpu_default_schedule, DEVICE, "model.cu"),
}


def model_target(target: str | Target) -> ModelTarget:
    """How models are built for `target`'s kind."""
    return MODEL_TARGETS[Target.parse(target).kind]


def times_kernels(target: str | Target) -> bool:
    """Whether a model built for `target` runs at its hardware's speed, so that in-model selection (select.py) may
    time it: not under -emulate=1 (CUDA kernels on the CPU's emulation)."""
    return not Target.parse(target).emulated
