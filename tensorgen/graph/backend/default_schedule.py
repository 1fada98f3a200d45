"""The schedule a subgraph gets when the database has no record for it: correct and parallel, untuned, one per
kind of target (model_target.MODEL_TARGETS).

Strictly inlinable stages are inlined (Ansor's Always Inline rule). On a CPU every remaining stage fuses its
outer spatial loops into one parallel loop with enough iterations for the cores, and vectorizes its innermost
spatial loop (moved inside the reduction loops when there are any) when it is short. On a GPU every remaining
stage's outer spatial loops are fused and spread over blocks of threads (schedule.gpu_bind): one thread per output
element, its reduction a serial loop; no CPU annotation (a parallel or vectorized loop would run serially inside
one thread).
"""

from __future__ import annotations

from collections.abc import Callable

from tensorgen.dag import ComputeDAG
from tensorgen.schedule.gpu_bind import bind_unbound
from tensorgen.schedule.state import State

MAX_VECTOR_EXTENT = 64
DefaultSchedule = Callable[[ComputeDAG, int], State]  # (the subgraph's DAG, the target's cores) -> its program


def inlined(dag: ComputeDAG) -> State:
    """The DAG's state with its strictly inlinable stages inlined."""
    state = State(dag)
    for t in dag.compute_tensors:
        if not dag.is_output(t.name) and dag.is_strict_inlinable(t.name):
            state = state.compute_inline(t.name)
    return state


def default_schedule(dag: ComputeDAG, cores: int) -> State:
    """A CPU's default: every root stage parallel over its outer spatial loops, its inner one vectorized."""
    state = inlined(dag)
    for stage in list(state.stages):
        if stage.tensor.is_placeholder or stage.location != "root":
            continue
        state = _parallelize(state, stage.name, cores)
    return state


def gpu_default_schedule(dag: ComputeDAG, cores: int) -> State:
    """A GPU's default: every root stage over blocks of threads (`cores` does not matter)."""
    return bind_unbound(inlined(dag))


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
