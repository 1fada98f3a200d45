"""Schedule transfer between tasks of the same structure: a conv's best program is a good first guess for
the conv of the next layer.

A network's tasks are mostly the same subgraph at other shapes (ResNet-50 has 27 tasks and a handful of
structures), and their sketches are identical step for step: only the split lengths depend on the shape.
`adapt` replays one task's program on another task's DAG with every split refitted to the new extents
(each factor moved to the nearest divisor of what is left, innermost first, so the register tile and the
vector length survive), which gives a valid program of the new task whenever the structures match.
Ansor starts every task from random samples; seeding the first round with adapted best programs of
similar tasks is what lets a model with dozens of tasks get good kernels from a few trials per task.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from tensorgen.dag import ComputeDAG
from tensorgen.errors import ScheduleError
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import SplitStep
from tensorgen.search.annotate import divisors, is_valid


def refit_lengths(extent: int, lengths: Sequence[int], inner_to_outer: bool = True) -> tuple[int, ...]:
    """Split lengths that tile `extent` perfectly, each as close (in ratio) to the given one as the divisors
    of what is left allow; the innermost factor is fitted first (for nparts splits, the outermost)."""
    order = range(len(lengths) - 1, -1, -1) if inner_to_outer else range(len(lengths))
    out = list(lengths)
    left = extent
    for k in order:
        want = max(int(lengths[k]), 1)
        out[k] = min(divisors(left), key=lambda d: (abs(math.log(d / want)), d))
        left //= out[k]
    return tuple(out)


def adapt(state: State, dag: ComputeDAG) -> State | None:
    """`state`'s program replayed on `dag` with refitted splits, or None where the structures differ (a step
    that does not apply, or a program that does not lower)."""
    if state.dag.workload_key == dag.workload_key:
        return state
    if len(state.dag.tensors) != len(dag.tensors):
        return None
    out = State(dag)
    try:
        for step in state.steps:
            if isinstance(step, SplitStep) and None not in step.lengths:
                extent = out.stages[step.stage_id].iters[step.iter_id].extent
                if extent is None:
                    return None
                step = replace(step, extent=extent, lengths=refit_lengths(extent, step.lengths, step.inner_to_outer))
            out.apply(step)
    except (ScheduleError, IndexError):
        return None
    return out if is_valid(out) else None


def structure_key(dag: ComputeDAG) -> tuple:
    """What must match for a transfer to be worth trying: the stages' kinds and loop counts, in order."""
    return tuple((t.is_placeholder, t.ndim, len(t.reduce_axes), t.tag) for t in dag.tensors)


def transfer_candidates(dag: ComputeDAG, donors: Sequence[tuple[State, float]], limit: int = 8) -> list[State]:
    """Up to `limit` programs for `dag` adapted from `donors` ((state, its FLOP/s)), donors of the closest
    FLOP count first, faster first among equals; those that do not adapt are skipped."""
    key, flops = structure_key(dag), max(dag.flop_count, 1.0)
    ranked = sorted((d for d in donors if structure_key(d[0].dag) == key),
                    key=lambda d: (round(abs(math.log(max(d[0].dag.flop_count, 1.0) / flops)), 1), -d[1]))
    out: list[State] = []
    seen: set[str] = set()
    for state, _ in ranked:
        if len(out) >= limit:
            break
        adapted = adapt(state, dag)
        if adapted is not None and (text := adapted.to_json()) not in seen:
            seen.add(text)
            out.append(adapted)
    return out
