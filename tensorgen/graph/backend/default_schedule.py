"""The schedule a subgraph gets when the database has no record for it: correct and parallel, untuned.

Strictly inlinable stages are inlined (Ansor's Always Inline rule); every remaining stage fuses its
outer spatial loops into one parallel loop with enough iterations for the cores, and vectorizes its
innermost spatial loop (moved inside the reduction loops when there are any) when it is short.
"""

from __future__ import annotations

from tensorgen.dag import ComputeDAG
from tensorgen.schedule.state import State

MAX_VECTOR_EXTENT = 64


def default_schedule(dag: ComputeDAG, cores: int) -> State:
    state = State(dag)
    for t in dag.compute_tensors:
        if not dag.is_output(t.name) and dag.is_strict_inlinable(t.name):
            state = state.compute_inline(t.name)
    for stage in list(state.stages):
        if stage.tensor.is_placeholder or stage.location != "root":
            continue
        state = _parallelize(state, stage.name, cores)
    return state


def _parallelize(state: State, name: str, cores: int) -> State:
    iters = state.stage(name).iters
    spatial = 0
    while spatial < len(iters) and iters[spatial].kind == "spatial":
        spatial += 1
    if 1 < spatial < len(iters) and all(it.kind == "reduce" for it in iters[spatial:]):
        # a reduction innermost cannot be vectorized: move the last spatial loop inside it instead
        state = state.reorder(name, [it.name for it in (*iters[:spatial - 1], *iters[spatial:], iters[spatial - 1])])
        iters = state.stage(name).iters
        spatial -= 1
        inner_vector = (iters[-1].extent or 0) <= MAX_VECTOR_EXTENT
    else:
        inner_vector = spatial == len(iters) and spatial > 1 and (iters[-1].extent or 0) <= MAX_VECTOR_EXTENT
    outer, work = [], 1
    for it in iters[:spatial - 1 if inner_vector and spatial == len(iters) else spatial]:
        if work >= 4 * cores:
            break
        outer.append(it.name)
        work *= it.extent or 1
    if inner_vector:
        state = state.vectorize(name, iters[-1].name)
    if len(outer) > 1:
        state = state.fuse(name, outer)
        outer = [state.stage(name).iters[0].name]
    if outer and work > 1:
        state = state.parallel(name, outer[0])
    return state
