"""What Ansor's search does per target kind: the sketch rules, the random annotation (its knobs, its sampler, what
counts as a valid program) and the mutations. CPUs: rules.DEFAULT_RULES, annotate.sample_state; CUDA GPUs:
gpu_rules.GPU_RULES, gpu_annotate.sample_gpu_state and TVM's GPU mutations (tile sizes 0.90, auto-unroll 0.10;
the parallel granularity and compute locations are CPU decisions). `for_target(task)` picks the entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tensorgen.errors import TuneError
from tensorgen.schedule.state import State
from tensorgen.search.annotate import AnnotationPolicy, Sampler, is_valid, sample_state
from tensorgen.search.gpu_annotate import GpuAnnotationPolicy, is_valid_gpu, sample_gpu_state
from tensorgen.search.gpu_rules import GPU_RULES
from tensorgen.search.mutations import DEFAULT_MUTATIONS, Mutation, PragmaMutation, TileSizeMutation
from tensorgen.search.rules import DEFAULT_RULES, SketchRule
from tensorgen.task import SearchTask


@dataclass(frozen=True)
class TargetSearch:
    """The search's parts for one target kind."""

    rules: tuple[SketchRule, ...]
    mutations: tuple[Mutation, ...]
    annotation: Callable[[], AnnotationPolicy]  # the default annotation knobs
    sample: Sampler  # one random complete program of a sketch (ScheduleError: none this time)
    valid: Callable[[SearchTask, State], bool]  # the state is a program the target runs

    def validate(self, task: SearchTask, states: Sequence[State]) -> list[bool]:
        return [self.valid(task, s) for s in states]


def _valid_cpu(task: SearchTask, state: State) -> bool:
    return is_valid(state)


def _valid_gpu(task: SearchTask, state: State) -> bool:
    return is_valid_gpu(state, task.hw)


GPU_MUTATIONS: tuple[Mutation, ...] = (
    TileSizeMutation(0.90, GpuAnnotationPolicy()),
    PragmaMutation(0.10, GpuAnnotationPolicy()),
)

TARGET_SEARCH: dict[str, TargetSearch] = {
    "cpu": TargetSearch(DEFAULT_RULES, DEFAULT_MUTATIONS, AnnotationPolicy, sample_state, _valid_cpu),
    "cuda": TargetSearch(GPU_RULES, GPU_MUTATIONS, GpuAnnotationPolicy, sample_gpu_state, _valid_gpu),
}


def for_target(task: SearchTask) -> TargetSearch:
    """The search's parts for `task`'s target kind."""
    search = TARGET_SEARCH.get(task.target.kind)
    if search is None:
        raise TuneError(f"target {task.target}: no search space for kind {task.target.kind!r}; "
                        f"known: {', '.join(TARGET_SEARCH)}")
    return search
