"""Thread bindings for GPU programs that have none: a stage's outer space loops fused and spread over blocks of
threads (what an element-wise kernel wants, and a correct start for any other: TVM's default CUDA schedule)."""

from __future__ import annotations

from tensorgen.schedule.stage import GPU_ANNOTATIONS
from tensorgen.schedule.state import State

DEFAULT_THREADS = 256


def bind_flat(state: State, i: int, threads: int) -> None:
    """Fuse stage i's outer space loops (up to an attach point) and spread them over blocks of `threads`."""
    st = state.stages[i]
    points = {s.attach for s in state.stages if s.attach}
    prefix: list[str] = []
    for it in st.iters:
        if it.kind != "spatial" or it.annotation != "none":
            break
        prefix.append(it.name)
        if (st.name, it.name) in points:
            break
    if not prefix:
        return
    if len(prefix) > 1:
        state.fuse(i, prefix)
    fused = state.stages[i].iters[0]
    assert fused.extent is not None
    if fused.extent <= threads:
        state.bind(i, fused.name, "threadIdx.x")
        return
    state.split(i, fused.name, [threads])
    outer, inner = state.stages[i].iters[:2]
    state.bind(i, outer.name, "blockIdx.x").bind(i, inner.name, "threadIdx.x")


def bind_unbound(state: State, threads: int = DEFAULT_THREADS) -> State:
    """A copy of `state` whose root stages without a GPU binding are bound by bind_flat."""
    state = state.copy()
    for i in range(len(state.stages) - 1, -1, -1):
        st = state.stages[i]
        if st.is_placeholder or st.location != "root" or any(it.annotation in GPU_ANNOTATIONS for it in st.iters):
            continue
        bind_flat(state, i, threads)
    return state
