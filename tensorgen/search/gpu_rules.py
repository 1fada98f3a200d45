"""Sketch derivation rules for GPUs (Ansor §4.3): the table `GPU_RULES` that `generate_sketches` uses for CUDA
targets, in TVM's GPU order.

The CPU rules serve with GPU settings: multi-level tiling is "SSSRRSRS", whose first three space levels random
annotation fuses and binds to blockIdx.x, vthread and threadIdx.x (`gpu_annotate.bind_threads`); a tiled stage
is always fused into its element-wise consumer (at the third level: the thread's tile) or written through a
local cache stage, never left alone; every non-output stage without a reduction is inlined. Three rules are the
GPU's own:

* AddSharedCacheRead: an operand of a tiled stage (read at one index) is copied into shared memory at the
  outermost reduction tile (annotation makes the block's threads fetch it together);
* CrossThreadReduction: a reduction with little space parallelism (a tiled stage with fewer outputs than
  reduction steps, any other reduction longer than a warp) is split by rfactor into partial sums over a new
  space axis, which annotation binds to threads like any space loop: the partial sums run in parallel in one
  kernel and the final sums in the next (there is no in-block all-reduce in the CUDA code generator);
* SpecialComputeLocationGPU: the producer of a stage that reads small constant tensors (Winograd) is computed
  at that stage's last loop outside the unrolled ones.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tensorgen.schedule.state import State
from tensorgen.search.rules import (
    CONST_TENSOR_INDICES,
    AddCacheWrite,
    AlwaysInline,
    Cond,
    Derivation,
    MultiLevelTiling,
    MultiLevelTilingWithFusion,
    SimplifyComputeWithConstTensor,
    SketchRule,
    SkipStage,
    has_data_reuse,
    is_cache_write_stage,
    is_compute,
    is_tiled,
    split_reduction,
)
from tensorgen.te.expr import Load, Reduce, walk

if TYPE_CHECKING:
    from tensorgen.task import SearchTask

#: Ansor's GPU tiling: block, virtual thread, thread, two reduction tiles, the thread's tile
GPU_STRUCTURE = "SSSRRSRS"
#: the space levels bound to the GPU, outermost first (random annotation binds them)
GPU_LEVELS = ("blockIdx.x", "vthread", "threadIdx.x")


def outer_reduce_iter(state: State, i: int) -> str | None:
    """The last loop of stage i's outermost reduction tile: its n-th reduction loop, n its reduce axes."""
    st = state.stages[i]
    reduce = [it.name for it in st.iters if it.kind == "reduce"]
    n = len(st.root_names) - st.tensor.ndim
    return reduce[n - 1] if 0 < n <= len(reduce) else None


class AddSharedCacheRead(SketchRule):
    """A stage read (directly) by a single tiled stage only, at one index, is copied into shared memory, computed
    at the tiled stage's outermost reduction tile; the derivation stays at the stage (now read by the copy only,
    so the next rule may inline it into the copy). A stage read at two indices (A @ A) is not: the copy would
    hold the block's tiles of both reads, the whole tensor."""

    name = "add_shared_cache_read"

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        st = state.stages[i]
        if st.location == "inline":
            return Cond.SKIP
        consumers = state.effective_consumers(st.name)
        if len(consumers) != 1 or consumers[0] not in state.consumers(st.name):
            return Cond.SKIP
        r = state.stage_id(consumers[0])
        body = state.stages[r].tensor.body
        reads = {n.indices for n in walk(body) if isinstance(n, Load) and n.tensor.name == st.name}
        ok = len(reads) == 1 and is_tiled(state, r) and has_data_reuse(state, r) and \
            outer_reduce_iter(state, r) is not None
        return Cond.APPLY_AND_SKIP_REST if ok else Cond.SKIP

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        reader = state.effective_consumers(state.stages[i].name)[0]
        s = state.copy().cache_read(i, "shared", [reader])
        r = s.stage_id(reader)
        at = outer_reduce_iter(s, r)
        assert at is not None
        return [(s.compute_at(i + 1, r, at), i)]


class CrossThreadReduction(SketchRule):
    """Ansor's rule for reductions with little space parallelism: the reduction loops fused, split by a
    length annotation samples, and the inner part factored out (rfactor) into a space axis of a partial-sum
    stage, kept outermost with the other space axes so that the threads take it (consecutive threads read
    consecutive elements). Offered besides the stage's other sketches."""

    name = "cross_thread_reduction"

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        st = state.stages[i]
        if not is_compute(state, i) or not isinstance(st.tensor.body, Reduce) or is_cache_write_stage(state, i):
            return Cond.SKIP
        space = math.prod(it.extent or 1 for it in st.iters if it.kind != "reduce")
        reduce = math.prod(it.extent or 1 for it in st.iters if it.kind == "reduce")
        if has_data_reuse(state, i):
            return Cond.APPLY if space < reduce else Cond.SKIP
        return Cond.APPLY if reduce > task.hw.warp_size else Cond.SKIP

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        base, (_, inner), n_space = split_reduction(state, i)
        return [(base.rfactor(i, inner, n_space), i - 1)]


class SpecialComputeLocationGPU(SketchRule):
    """The producer of a stage that reads small constant tensors (SimplifyComputeWithConstTensor's, e.g. a
    Winograd transform) is computed at that stage's last loop before its unrolled ones."""

    name = "special_compute_location_gpu"

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        st = state.stages[i]
        if not is_compute(state, i) or not state.direct_producers(st.name):
            return Cond.SKIP
        consumers = state.effective_consumers(st.name)
        ok = len(consumers) == 1 and state.stage(consumers[0]).tensor.attrs.get(CONST_TENSOR_INDICES)
        return Cond.APPLY_AND_SKIP_REST if ok else Cond.SKIP

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        target = state.stage(state.effective_consumers(state.stages[i].name)[0])
        names = [it.name for it in target.iters]
        first = next((k for k, it in enumerate(target.iters) if it.annotation == "unroll"), 0)
        if first == 0:
            return [(state, i - 1)]
        return [(state.copy().compute_at(i, target.name, names[first - 1]), i - 1)]


GPU_RULES: tuple[SketchRule, ...] = (
    AddSharedCacheRead(),
    SpecialComputeLocationGPU(),
    AlwaysInline(strict=False),
    SimplifyComputeWithConstTensor(),
    CrossThreadReduction(),
    AddCacheWrite(skip_rest=True),
    MultiLevelTilingWithFusion(GPU_STRUCTURE, levels=(3,), skip_rest=True),
    MultiLevelTiling(GPU_STRUCTURE),
    SkipStage(),
)
