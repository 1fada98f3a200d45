"""Mutation rules of the evolutionary search (Ansor §5.1): rewrite one decision of a complete program.

Every decision random annotation makes (`tensorgen.search.annotate`) has a rule here that revisits
it: tile sizes, the parallel granularity, the auto-unroll pragma and the location of flexible
stages. A rule is a small class with a `weight`, a condition (`applicable`) and an application
(`apply`) that edits a copy of the step list and replays it; a step that no longer applies makes the
rule answer None instead of raising. Surviving states are *not* lowered here: the caller validates
them (the evolution does it through the feature extractor, which lowers every state it scores).

`DEFAULT_MUTATIONS` is the weighted table (Ansor/TVM's weights, a tuple: nobody changes it for everyone);
a caller passes its own list (`[*DEFAULT_MUTATIONS, Mine(weight=0.1)]`) to `mutate` or to a policy
(`SketchPolicy(mutations=...)`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from typing import ClassVar

import numpy as np

from tensorgen.errors import ScheduleError
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import (
    AnnotationStep,
    ComputeAtStep,
    ComputeInlineStep,
    ComputeRootStep,
    FuseStep,
    PragmaStep,
    SplitStep,
    Step,
)
from tensorgen.search.annotate import (
    AnnotationPolicy,
    annotate_parallel,
    annotate_unroll,
    annotate_vectorize,
    divisors,
    location_candidates,
    shares_work,
)
from tensorgen.search.rules import has_data_reuse, is_output, is_tiled
from tensorgen.search.skips import Skips
from tensorgen.task import SearchTask
from tensorgen.te.expr import Reduce

LOCATION_STEPS = (ComputeAtStep, ComputeInlineStep, ComputeRootStep)
ANNOTATION_STEPS = (*LOCATION_STEPS, FuseStep, AnnotationStep, PragmaStep)


def replay(task: SearchTask, steps: Sequence[Step]) -> State | None:
    """The state `steps` make, or None when one of them no longer applies."""
    try:
        return task.replayer(steps)
    except ScheduleError:
        return None


def annotation_start(steps: Sequence[Step]) -> int:
    """Index of the first step of the annotation phase (parallel/unroll/vectorize): right after the
    last structural step and the location steps that follow it. Stage ids are stable from here on."""
    last = max((n for n, s in enumerate(steps) if not isinstance(s, ANNOTATION_STEPS)), default=-1)
    return next((n for n in range(last + 1, len(steps)) if not isinstance(steps[n], LOCATION_STEPS)), len(steps))


def location_phase_start(steps: Sequence[Step]) -> int:
    """Index of the first location step random annotation added (the end of the sketch's steps)."""
    first = annotation_start(steps)
    while first > 0 and isinstance(steps[first - 1], LOCATION_STEPS):
        first -= 1
    return first


def final_stage_id(steps: Sequence[Step], n: int, end: int | None = None) -> int:
    """The id, once `steps[:end]` (default: all) are applied, of the stage `steps[n]` transforms: a step names a
    stage by its index at that time, and the stages added after it shift the index."""
    sid = steps[n].stage_id
    for later in steps[n + 1:end]:
        if later.new_stage_offset is not None and later.stage_id + later.new_stage_offset <= sid:
            sid += 1
    return sid


def sketched_stages(steps: Sequence[Step], first: int) -> set[int]:
    """Ids, in the final state, of the stages the sketch's steps (`steps[:first]`) transform."""
    return {final_stage_id(steps, n, first) for n in range(first)}


def is_flexible(state: State, i: int) -> bool:
    """A stage whose location random annotation chose (Ansor: not multi-level tiled, not an output)."""
    st = state.stages[i]
    return not (st.is_placeholder or st.location == "inline" or is_output(state, i)
                or is_tiled(state, i) or has_data_reuse(state, i))


def _remap_iters(step: Step, stage_id: int, fn: Callable[[int], int]) -> Step:
    """`step` with every iterator index of stage `stage_id` it names passed through `fn`."""
    changes = {}
    for f in fields(step):
        v = getattr(step, f.name)
        if step.stage_id == stage_id and f.name == "iter_id":
            changes[f.name] = fn(v)
        elif step.stage_id == stage_id and f.name in ("iter_ids", "after_ids"):
            changes[f.name] = tuple(fn(x) for x in v)
        elif f.name == "target_iter_id" and step.target_stage_id == stage_id:
            changes[f.name] = fn(v)
    return replace(step, **changes) if changes else step


def _remap_step_refs(step: Step, start: int, delta: int) -> Step:
    """`step` with references to step indices >= start shifted by `delta` (follow splits)."""
    if hasattr(step, "src_step_id") and step.src_step_id >= start:
        return replace(step, src_step_id=step.src_step_id + delta)
    if hasattr(step, "src_step_ids"):
        return replace(step, src_step_ids=tuple(s + delta if s >= start else s for s in step.src_step_ids))
    return step


def _pick(rng: np.random.Generator, items: Sequence):
    """A uniformly chosen item; None from an empty sequence (a rule applied where it does not apply)."""
    return items[int(rng.integers(len(items)))] if items else None


class Mutation:
    """Base of mutation rules; subclasses set `name` and implement `applicable` and `apply`."""

    name: ClassVar[str] = "mutation"

    def __init__(self, weight: float = 1.0, policy: AnnotationPolicy | None = None):
        self.weight = weight
        self.policy = policy or AnnotationPolicy()

    def applicable(self, task: SearchTask, state: State) -> bool:
        raise NotImplementedError

    def apply(self, task: SearchTask, state: State, rng: np.random.Generator) -> State | None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(weight={self.weight})"


class TileSizeMutation(Mutation):
    """Move a factor from one tile level of a split to another: the product stays the loop's extent,
    so the tiling stays perfect, and follow splits pick the new lengths up on replay."""

    name = "tile_size"

    def __init__(self, weight: float = 0.90, policy: AnnotationPolicy | None = None, tries: int = 8):
        super().__init__(weight, policy)
        self.tries = tries

    @staticmethod
    def candidates(state: State) -> list[int]:
        """Split steps with known lengths that tile their extent perfectly and have a factor to move."""
        return [n for n, s in enumerate(state.steps)
                if isinstance(s, SplitStep) and s.extent and None not in s.lengths and s.extent > 1
                and s.extent % math.prod(s.lengths) == 0]

    def applicable(self, task: SearchTask, state: State) -> bool:
        return bool(self.candidates(state))

    def mutate_lengths(self, step: SplitStep, rng: np.random.Generator) -> tuple[int, ...] | None:
        rest = step.extent // math.prod(step.lengths)
        full = [rest, *step.lengths] if step.inner_to_outer else [*step.lengths, rest]
        for _ in range(self.tries):
            src = _pick(rng, [k for k, v in enumerate(full) if v > 1])
            factor = _pick(rng, divisors(full[src])[1:])
            dst = _pick(rng, [k for k in range(len(full)) if k != src])
            new = list(full)
            new[src] //= factor
            new[dst] *= factor
            if new[-1] <= self.policy.max_innermost:
                return tuple(new[1:] if step.inner_to_outer else new[:-1])
        return None

    def apply(self, task: SearchTask, state: State, rng: np.random.Generator) -> State | None:
        n = _pick(rng, self.candidates(state))
        if n is None:
            return None
        step = state.steps[n]
        lengths = self.mutate_lengths(step, rng)
        if lengths is None:
            return None
        steps = list(state.steps)
        steps[n] = replace(step, lengths=lengths)
        child = replay(task, steps)
        if child is not None and not shares_work(child) and shares_work(state):
            return None  # every factor left the parallel loop: the program would run on one core
        return child


class ParallelMutation(Mutation):
    """Change how many outer loops are fused into a parallel loop (the parallel granularity).

    Later steps of the stage name iterators by index, so they are shifted by the change in fused count.
    """

    name = "parallel"

    def __init__(self, weight: float = 0.01, policy: AnnotationPolicy | None = None):
        super().__init__(weight, policy)

    def applicable(self, task: SearchTask, state: State) -> bool:
        return any(isinstance(s, AnnotationStep) and s.annotation == "parallel" for s in state.steps)

    def apply(self, task: SearchTask, state: State, rng: np.random.Generator) -> State | None:
        steps = list(state.steps)
        q = _pick(rng, [n for n, s in enumerate(steps) if isinstance(s, AnnotationStep) and s.annotation == "parallel"])
        if q is None:
            return None
        par = steps[q]
        i, a = par.stage_id, par.iter_id
        prev = steps[q - 1] if q else None
        fused = isinstance(prev, FuseStep) and prev.stage_id == i and prev.iter_ids[0] == a
        start, old_k = (q - 1, len(prev.iter_ids)) if fused else (q, 1)
        before = replay(task, steps[:start])
        if before is None:
            return None
        st = before.stages[i]
        points = {s.attach for s in before.stages if s.attach}
        extents: list[int] = []
        for it in st.iters[a:]:
            if it.kind != "spatial" or it.annotation != "none" or it.extent is None:
                break
            extents.append(it.extent)
            if math.prod(extents) > task.hw.cores * self.policy.parallel_per_core or (st.name, it.name) in points:
                break
        choices = [k for k in range(1, len(extents) + 1) if k != old_k and math.prod(extents[:k]) > 1]
        if not choices:
            return None
        k = _pick(rng, choices)
        mid: list[Step] = [FuseStep(i, tuple(range(a, a + k)))] if k > 1 else []
        mid.append(AnnotationStep(i, a, "parallel"))
        delta = len(mid) - (q + 1 - start)
        shift = old_k - k
        tail = [_remap_step_refs(_remap_iters(s, i, lambda j: j + shift if j > a else j), q + 1, delta)
                for s in steps[q + 1:]]
        return replay(task, steps[:start] + mid + tail)


class PragmaMutation(Mutation):
    """Set an auto_unroll_max_step pragma to another of the policy's values."""

    name = "pragma"

    def __init__(self, weight: float = 0.04, policy: AnnotationPolicy | None = None):
        super().__init__(weight, policy)

    @staticmethod
    def candidates(state: State) -> list[int]:
        return [n for n, s in enumerate(state.steps)
                if isinstance(s, PragmaStep) and s.pragma.startswith("auto_unroll_max_step$")]

    def applicable(self, task: SearchTask, state: State) -> bool:
        return bool(self.candidates(state)) and len(self.policy.unroll_steps) > 1

    def apply(self, task: SearchTask, state: State, rng: np.random.Generator) -> State | None:
        n = _pick(rng, self.candidates(state))
        if n is None:
            return None
        step = state.steps[n]
        current = step.pragma.partition("$")[2]
        values = [v for v in self.policy.unroll_steps if str(v) != current]
        steps = list(state.steps)
        steps[n] = replace(step, pragma=f"auto_unroll_max_step${_pick(rng, values)}")
        return replay(task, steps)


class ComputeLocationMutation(Mutation):
    """Move a flexible stage (e.g. padding) to root, inline, or another loop of its consumer.

    The stage's own annotation steps are dropped and re-sampled for its new place (a stage computed at
    a loop is not parallelized; an inlined one has no loops), the new location step goes where the
    location phase ends so it names the consumer's loops before they are fused.
    """

    name = "compute_location"

    def __init__(self, weight: float = 0.05, policy: AnnotationPolicy | None = None):
        super().__init__(weight, policy)

    @staticmethod
    def candidates(state: State) -> list[int]:
        """Flexible stages that no sketch step touched and that have somewhere else to go."""
        first = location_phase_start(state.steps)
        sketched = sketched_stages(state.steps, first)
        out = []
        for i in range(len(state.stages)):
            if i in sketched or not is_flexible(state, i):
                continue
            st = state.stages[i]
            if st.location == "root" and isinstance(st.tensor.body, Reduce) and not location_candidates(state, i):
                continue  # a root reduction with no consumer loop to move into
            out.append(i)
        return out

    def applicable(self, task: SearchTask, state: State) -> bool:
        return bool(self.candidates(state))

    def apply(self, task: SearchTask, state: State, rng: np.random.Generator) -> State | None:
        i = _pick(rng, self.candidates(state))
        if i is None:
            return None
        steps = list(state.steps)
        p, first = annotation_start(steps), location_phase_start(steps)
        own = [n for n in range(first, len(steps)) if steps[n].stage_id == i]
        kept = [s for n, s in enumerate(steps) if n not in own]
        p_kept = p - sum(n < p for n in own)
        before = replay(task, kept[:p_kept])
        if before is None:
            return None
        orig = state.stages[i]
        options: list[Step] = []
        if orig.location != "root":
            options.append(ComputeRootStep(i))
        if orig.location != "inline" and not isinstance(orig.tensor.body, Reduce):
            options.append(ComputeInlineStep(i))
        consumers = before.effective_consumers(orig.name)
        for name in location_candidates(before, i):
            if (consumers[0], name) != orig.attach:
                target = before.stage(consumers[0])
                options.append(ComputeAtStep(i, before.stage_id(target.name), target.iter_index(name)))
        if not options:
            return None
        new = _pick(rng, options)
        try:
            if not (isinstance(new, ComputeRootStep) and before.stages[i].location == "root"):
                before.apply(new)
            for s in kept[p_kept:]:
                before.apply(s)
            probe = before.copy()
            annotate_parallel(probe, task.hw.cores, rng, self.policy)
            annotate_unroll(probe, rng, self.policy)
            annotate_vectorize(probe, rng, self.policy)
            for s in probe.steps[len(before.steps):]:
                if s.stage_id == i:
                    before.apply(s)
        except ScheduleError:
            return None
        moved = before.stages[i]
        if (moved.location, moved.attach) == (orig.location, orig.attach):
            return None  # an attach point named before a fuse that the fuse then renamed: the same place
        return before


DEFAULT_MUTATIONS: tuple[Mutation, ...] = (
    TileSizeMutation(),
    ParallelMutation(),
    PragmaMutation(),
    ComputeLocationMutation(),
)


def mutate(task: SearchTask, state: State, rng: np.random.Generator, rules: Sequence[Mutation] | None = None,
           skips: Skips | None = None) -> tuple[State | None, Mutation | None]:
    """Apply one applicable rule chosen by weight; (None, rule) if it failed, (None, None) if none applies.
    A rule that raises (a bug: rules answer None for what they cannot do) counts as not applicable, or as
    failed, and is counted in `skips`."""
    skips = skips if skips is not None else Skips()
    table = []
    for r in DEFAULT_MUTATIONS if rules is None else rules:
        with skips.guard("mutation", f"{r.name} on {task}"):
            if r.weight > 0 and r.applicable(task, state):
                table.append(r)
    if not table:
        return None, None
    w = np.array([r.weight for r in table], dtype=np.float64)
    rule = table[int(rng.choice(len(table), p=w / w.sum()))]
    child = None
    with skips.guard("mutation", f"{rule.name} on {task}"):
        child = rule.apply(task, state, rng)
    return child, rule
