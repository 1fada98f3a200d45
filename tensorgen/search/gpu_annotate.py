"""Random annotation for GPUs (Ansor's InitFillTileSize, InitThreadBind and InitUnroll for CUDA targets): complete
a GPU sketch (`gpu_rules`) into a program a GPU can run.

* Tile sizes are drawn as on CPUs (uniform perfect tilings), again until the block each tiled stage asks for
  fits the GPU: at most `max_threads_per_block` threads (whole warps preferred: a draw that is not is kept only
  when half the tries found none that is), at most `max_vthread` virtual threads, a thread's tile of at most
  `max_local_tile` elements, and shared tiles (bound inference over a virtual thread's tile, as lowering does) within
  `shared_mem_per_block`.
* Thread binding: a tiled stage's root fuses each of its first three space levels and binds them to blockIdx.x,
  vthread and threadIdx.x; a shared tile is fetched by the block's threads together (its loops fused, split by
  the block's thread count with a follow split of the tiled stage's thread level, so tile-size mutations keep
  them equal, and bound to threadIdx.x); every other root stage fuses its outer space loops and splits them into
  blockIdx.x x threadIdx.x with a random whole-warp thread count.
* auto_unroll_max_step on every stage with a reduction (GPU values: 0, 16, 64, 512, 1024).

A program is valid when it lowers for the GPU and renders as CUDA (`is_valid_gpu`): the code generator refuses
what no GPU runs (too many threads or too much shared memory per block, a barrier some threads skip).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from tensorgen.codegen.cuda import render_cuda
from tensorgen.errors import LoweringError, ScheduleError
from tensorgen.loopir.simplify import Ranges
from tensorgen.schedule.bound import interval, union
from tensorgen.schedule.gpu_bind import bind_flat
from tensorgen.schedule.lower import lower
from tensorgen.schedule.stage import GPU_ANNOTATIONS, Split, Stage
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import SplitStep
from tensorgen.search.annotate import AnnotationPolicy, annotate_unroll, replay_filled, tunable_splits
from tensorgen.search.gpu_rules import GPU_LEVELS, GPU_STRUCTURE
from tensorgen.search.mutations import final_stage_id
from tensorgen.target import HardwareParams
from tensorgen.task import SearchTask
from tensorgen.te.expr import Expr, Load, Reduce, Var, substitute, walk

#: lengths of a GPU-tiled stage's space split (its levels but the outermost): vthread, thread, two inner tiles
SPACE_LENGTHS = GPU_STRUCTURE.count("S") - 1
VTHREAD, THREAD = 0, 1  # indices of those levels in the lengths


@dataclass
class GpuAnnotationPolicy(AnnotationPolicy):
    """Ansor's GPU knobs on top of the CPU's (`max_innermost` and the factorization memo are shared)."""

    unroll_steps: tuple[int, ...] = (0, 16, 64, 512, 1024)
    max_vthread: int = 8
    max_local_tile: int = 64  # elements of one thread's tile (its accumulators, in registers)
    tries: int = 32  # tile draws per sample


@dataclass(frozen=True)
class Block:
    """What the tile sizes of one GPU-tiled stage ask of a block."""

    threads: int
    vthreads: int
    local: int  # elements of a thread's tile
    shared_bytes: int  # the shared tiles a virtual thread fetches per step of the outer reduction tile

    def fits(self, hw: HardwareParams, policy: GpuAnnotationPolicy) -> bool:
        return (self.threads <= hw.max_threads_per_block and self.vthreads <= policy.max_vthread
                and self.local <= policy.max_local_tile and self.shared_bytes <= hw.shared_mem_per_block)


def sample_gpu_state(task: SearchTask, sketch: State, rng: np.random.Generator,
                     policy: AnnotationPolicy | None = None) -> State:
    """One random complete GPU program from `sketch` (ScheduleError when no draw fits the GPU)."""
    policy = policy or GpuAnnotationPolicy()
    limits = policy if isinstance(policy, GpuAnnotationPolicy) else GpuAnnotationPolicy()
    state = draw_tiles(sketch, rng, policy, limits, task.hw)
    bind_threads(state, rng, task.hw)
    annotate_unroll(state, rng, policy)
    return state


@dataclass
class TileDraw:
    """One draw of a sketch's tile sizes (a `replay_filled` fill): uniform perfect tilings, the space splits of a
    GPU-tiled stage drawn one axis after the other, each among the tilings that keep the stage's virtual
    threads, threads and thread's tile so far within the limits."""

    rng: np.random.Generator
    policy: AnnotationPolicy
    limits: GpuAnnotationPolicy
    hw: HardwareParams
    used: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # per stage: vthreads, threads, tile

    def __call__(self, n: int, step: SplitStep, extent: int) -> SplitStep:
        choices = self.policy.factorizations(extent, len(step.lengths), step.inner_to_outer)
        block = len(step.lengths) == SPACE_LENGTHS
        if block:
            choices = [c for c in choices if self.within(self.grown(step.stage_id, c))]
            if not choices:
                raise ScheduleError(f"split step {n}: no tiling within the block's limits")
        lengths = choices[int(self.rng.integers(len(choices)))]
        if block:
            self.used[step.stage_id] = self.grown(step.stage_id, lengths)
        return replace(step, extent=extent, lengths=lengths)

    def grown(self, stage_id: int, lengths: tuple[int, ...]) -> tuple[int, int, int]:
        v, t, tile = self.used.get(stage_id, (1, 1, 1))
        return v * lengths[VTHREAD], t * lengths[THREAD], tile * math.prod(lengths[THREAD + 1:])

    def within(self, use: tuple[int, int, int]) -> bool:
        return use[0] <= self.limits.max_vthread and use[1] <= self.hw.max_threads_per_block \
            and use[2] <= self.limits.max_local_tile


def draw_tiles(sketch: State, rng: np.random.Generator, policy: AnnotationPolicy, limits: GpuAnnotationPolicy,
               hw: HardwareParams) -> State:
    """The sketch with tile sizes (`TileDraw`) whose blocks fit `hw` (see the module docstring)."""
    tunable = tunable_splits(sketch.steps)
    for attempt in range(limits.tries):
        try:
            state = replay_filled(sketch.dag, list(sketch.steps), tunable, TileDraw(rng, policy, limits, hw))
        except ScheduleError:
            continue
        blocks = [b for i in range(len(state.stages)) if (b := block_of(state, i)) is not None]
        if all(b.fits(hw, limits) for b in blocks) and (
                attempt >= limits.tries // 2 or all(b.threads % hw.warp_size == 0 for b in blocks)):
            return state
    raise ScheduleError(f"no tile sizes within the GPU's limits in {limits.tries} draws")


def space_splits(st: Stage) -> dict[str, tuple[int, ...]]:
    """The lengths of the GPU tiling's splits of `st`'s space axes, by axis (empty: `st` is not GPU-tiled)."""
    space = st.root_names[:st.tensor.ndim]
    return {r.parent: r.lengths for r in st.relations  # type: ignore[misc]
            if isinstance(r, Split) and r.parent in space and len(r.lengths) == SPACE_LENGTHS}


def block_of(state: State, i: int) -> Block | None:
    """The block stage i asks for when it is GPU-tiled (its tile sizes filled), else None."""
    st = state.stages[i]
    spatial = space_splits(st)
    if not spatial or None in (x for lengths in spatial.values() for x in lengths):
        return None
    tile = {name: (lengths[VTHREAD], math.prod(lengths[THREAD:])) for name, lengths in spatial.items()}
    tile |= {r.parent: (1, math.prod(r.lengths)) for r in st.relations  # type: ignore[misc]
             if isinstance(r, Split) and r.parent in st.root_names[st.tensor.ndim:]}
    shared = sum(shared_bytes(st, p, tile) for p in state.stages
                 if p.attach and p.attach[0] == st.name and p.tensor.attrs.get("scope") == "shared")
    return Block(threads=math.prod(x[THREAD] for x in spatial.values()),
                 vthreads=math.prod(x[VTHREAD] for x in spatial.values()),
                 local=math.prod(math.prod(x[THREAD + 1:]) for x in spatial.values()),
                 shared_bytes=shared)


def shared_bytes(reader: Stage, tile_stage: Stage, tile: dict[str, tuple[int, int]]) -> int:
    """Bytes of `tile_stage` that `reader` reads in one virtual thread of a block whose tile is, per root axis of
    `reader`, `tile`'s (virtual threads, elements of each; reduce axes: one step of the outer reduction tile):
    the block's threads fetch it together. Its region is what lowering infers, from a block anywhere along each
    axis (a tile that a division does not divide evenly spans one row more); a dimension whose range is not
    affine counts whole."""
    t = reader.tensor
    axes = (*t.axes, *(t.body.axes if isinstance(t.body, Reduce) else ()))
    free: dict[Var, int] = {}
    ranges: Ranges = {}
    at: dict[Var, Expr] = {}
    for name, v in zip(reader.root_names, axes):
        vthreads, n = tile.get(name, (1, 1))
        blocks = -(-(v.extent or 1) // (vthreads * n))
        block, vthread, inner = (Var(f"{name}.{part}", "int32") for part in ("block", "vthread", "inner"))
        free[inner] = n
        ranges |= {block: (0, blocks - 1), vthread: (0, vthreads - 1), inner: (0, n - 1)}
        at[v] = (block * vthreads + vthread) * n + inner
    reads = [n for n in walk(t.body) if isinstance(n, Load) and n.tensor.name == tile_stage.name]
    elements = 1
    for d, full in enumerate(tile_stage.tensor.shape):
        parts = [interval(substitute(r.indices[d], at), free, ranges) for r in reads]
        merged = union(parts) if parts and None not in parts else None  # type: ignore[arg-type]
        elements *= full if merged is None else min(merged[1], full)
    return elements * np.dtype(tile_stage.tensor.dtype).itemsize


# ---------------------------------------------------------------------------------------------
# thread binding


def thread_counts(hw: HardwareParams) -> list[int]:
    """Whole-warp thread counts a block may have: a warp, doubled up to the most a block may have."""
    out = [hw.warp_size]
    while out[-1] * 2 <= hw.max_threads_per_block:
        out.append(out[-1] * 2)
    return out


def bind_threads(state: State, rng: np.random.Generator, hw: HardwareParams) -> None:
    """Bind the loops of every stage that has no binding yet (see the module docstring)."""
    tiled = {st.attach[0] if st.attach else st.name for st in state.stages if space_splits(st)}
    for i in range(len(state.stages) - 1, -1, -1):
        st = state.stages[i]
        if st.is_placeholder or st.location == "inline" or any(it.annotation in GPU_ANNOTATIONS for it in st.iters):
            continue
        if st.location == "root" and st.name in tiled:
            bind_levels(state, i)
        elif st.location == "root":
            bind_flat(state, i, int(rng.choice(thread_counts(hw))))
        elif st.tensor.attrs.get("scope") == "shared":
            fetch_together(state, i)


def bind_levels(state: State, i: int) -> None:
    """Fuse each of the first three space levels of stage i (one loop per space axis each) and bind them."""
    n = state.stages[i].tensor.ndim
    for level, axis in enumerate(GPU_LEVELS):
        its = state.stages[i].iters[level:level + n]
        if len(its) < n or any(it.kind != "spatial" or it.annotation != "none" for it in its):
            raise ScheduleError(f"stage {state.stages[i].name}: no space level {level} to bind to {axis}")
        if n > 1:
            state.fuse(i, [it.name for it in its])
        state.bind(i, state.stages[i].iters[level].name, axis)


def thread_splits(state: State, i: int) -> list[int]:
    """Ids of the split steps of stage i's space axes in the GPU tiling (their THREAD lengths: the block)."""
    return [n for n, step in enumerate(state.steps) if isinstance(step, SplitStep)
            and len(step.lengths) == SPACE_LENGTHS and final_stage_id(state.steps, n) == i]


def fetch_together(state: State, i: int) -> None:
    """Cooperative fetching: the block's threads copy shared tile i together."""
    st = state.stages[i]
    assert st.attach is not None
    reader = state.stage_id(st.attach[0])
    splits = thread_splits(state, reader)
    if len(st.iters) > 1:
        state.fuse(i, [it.name for it in st.iters])
    fused = state.stages[i].iters[0]
    threads = math.prod(state.steps[n].lengths[THREAD] or 1 for n in splits)  # type: ignore[attr-defined]
    if not splits or (fused.extent or 0) <= threads:
        state.bind(i, fused.name, "threadIdx.x")
        return
    state.follow_fused_split(i, fused.name, splits, THREAD, True)
    state.bind(i, state.stages[i].iters[1].name, "threadIdx.x")


def is_valid_gpu(state: State, hw: HardwareParams) -> bool:
    """The state lowers for a GPU and renders as CUDA within `hw`'s limits on threads and shared memory."""
    try:
        render_cuda(lower(state, gpu=True), hw.max_threads_per_block, hw.shared_mem_per_block)
    except (LoweringError, ScheduleError):
        return False
    return True
