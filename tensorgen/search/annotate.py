"""Random annotation (Ansor §4.2): complete sketches into programs = the initial population.

A sample picks a sketch uniformly, replays its steps with every unfilled split filled by a uniformly
chosen perfect tiling (for a share of CPU samples, one whose register tile suits the vector unit, see
`register_tile_lengths`), then (in Ansor's order) randomly moves flexible stages (root / inline /
compute_at), parallelizes the outer space loops of root stages, picks an auto-unroll depth for
stages with reductions, and vectorizes short innermost space loops. Each candidate is lowered and
dropped if lowering fails, so every returned State is a complete, valid program.

All randomness comes from the numpy Generator passed in: same seed, same population.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tensorgen.errors import LoweringError, ScheduleError
from tensorgen.schedule.lower import lower
from tensorgen.schedule.stage import Split, Stage
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import RfactorStep, SplitStep, Step
from tensorgen.search.rules import has_data_reuse, is_output, is_tiled
from tensorgen.search.skips import Skips
from tensorgen.target import HardwareParams
from tensorgen.task import SearchTask
from tensorgen.te.expr import Load, Reduce, Var, walk


@dataclass
class AnnotationPolicy:
    """The knobs of random annotation (Ansor's defaults); `memo` caches factorizations per policy."""

    max_innermost: int = 64
    max_vectorize: int = 16
    unroll_steps: tuple[int, ...] = (0, 16, 64, 512)
    parallel_per_core: int = 16  # stop fusing outer loops beyond cores * this
    min_parallel_flops: float = 1e6  # programs this big must use every core (see `starves_cores`)
    register_tile_share: float = 0.5  # samples whose tiled stages get a register tile (0: Ansor's uniform)
    memo: dict[tuple[int, int, int, bool], list[tuple[int, ...]]] = field(default_factory=dict, repr=False)

    def factorizations(self, extent: int, n: int, inner_to_outer: bool = True) -> list[tuple[int, ...]]:
        """All n-tuples of split lengths that tile `extent` perfectly, innermost loop <= max_innermost."""
        key = (extent, n, self.max_innermost, inner_to_outer)
        if key not in self.memo:
            out = []
            for lengths in _divisor_tuples(extent, n):
                inner = lengths[-1] if inner_to_outer else extent // math.prod(lengths)
                if inner <= self.max_innermost:
                    out.append(lengths)
            self.memo[key] = out
        return self.memo[key]


#: One random complete program of a sketch (raises ScheduleError when the draw is not one).
Sampler = Callable[[SearchTask, State, np.random.Generator, AnnotationPolicy | None], State]


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of n in increasing order (O(sqrt n); extents of fused loops reach 10^5 and more)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(small + [n // d for d in reversed(small) if d * d != n])


def _divisor_tuples(extent: int, n: int) -> list[tuple[int, ...]]:
    if n == 0:
        return [()]
    return [(d, *rest) for d in divisors(extent) for rest in _divisor_tuples(extent // d, n - 1)]


# ---------------------------------------------------------------------------------------------
# filling tile sizes


def tunable_splits(steps: Sequence[Step]) -> set[int]:
    """Ids of the split steps whose lengths annotation samples: unfilled ones, and the placeholder
    split right before an rfactor of one of its parts (see rules.AddRfactor)."""
    out = {n for n, s in enumerate(steps) if isinstance(s, SplitStep) and None in s.lengths}
    for n in range(len(steps) - 1):
        s, nxt = steps[n], steps[n + 1]
        if isinstance(s, SplitStep) and isinstance(nxt, RfactorStep) and nxt.stage_id == s.stage_id:
            out.add(n)
    return out


def fill_tile_sizes(sketch: State, rng: np.random.Generator, policy: AnnotationPolicy,
                    hw: HardwareParams | None = None) -> State:
    """Replay the sketch with sampled lengths; follow splits read them from the filled steps.

    With `hw` (a CPU's), a `register_tile_share` of the samples redraw the space tiles of each
    multi-level-tiled stage so that its register tile suits `hw` (see `register_tile_lengths`)."""
    steps = list(sketch.steps)
    tunable = tunable_splits(steps)

    def uniform(n: int, step: SplitStep, extent: int) -> SplitStep:
        choices = policy.factorizations(extent, len(step.lengths), step.inner_to_outer)
        return replace(step, extent=extent, lengths=choices[int(rng.integers(len(choices)))])

    state = replay_filled(sketch.dag, steps, tunable, uniform)
    if hw is None or policy.register_tile_share <= 0 or rng.random() >= policy.register_tile_share:
        return state
    changed = False
    for tiles in _space_tiles(steps, tunable).values():
        for n, lengths in zip(tiles, register_tile_lengths([steps[n] for n in tiles], rng, policy, hw)):
            changed |= lengths != steps[n].lengths
            steps[n] = replace(steps[n], lengths=lengths)

    def drawn(n: int, step: SplitStep, extent: int) -> SplitStep:
        if extent != step.extent:
            raise ScheduleError(f"split step {n}: its extent depends on a register tile drawn after it")
        return step

    return replay_filled(sketch.dag, steps, tunable, drawn) if changed else state


def replay_filled(dag, steps: list[Step], tunable: set[int],
                   fill: Callable[[int, SplitStep, int], SplitStep]) -> State:
    """Replay `steps`, each tunable split replaced (in `steps` too) by `fill(n, step, its iterator's extent)`."""
    state = State(dag)
    for n, step in enumerate(steps):
        if n in tunable:
            extent = state.stages[step.stage_id].iters[step.iter_id].extent
            if extent is None:
                raise ScheduleError(f"split step {n}: the iterator's extent is still unknown")
            steps[n] = step = fill(n, step, extent)
        state.apply(step)
    return state


def _space_tiles(steps: Sequence[Step], tunable: set[int]) -> dict[int, list[int]]:
    """Per stage, its tunable multi-level space splits (three or more inner lengths), in step order."""
    out: dict[int, list[int]] = {}
    for n in sorted(tunable):
        step = steps[n]
        if step.inner_to_outer and len(step.lengths) >= 3:
            out.setdefault(step.stage_id, []).append(n)
    return out


def register_tile_lengths(splits: Sequence[SplitStep], rng: np.random.Generator, policy: AnnotationPolicy,
                          hw: HardwareParams, tries: int = 256) -> list[tuple[int, ...]]:
    """Lengths for one stage's space splits whose register tile suits the vector unit, else theirs.

    In the SSRSRS structure the space levels inside the first reduction loop form the accumulator tile a
    cache_write stage holds (in registers, when it fits). Uniform tiles rarely make a good one: of GMM
    1024's 266 tilings per axis a quarter end in whole 16-lane vectors, and under 5% give 12-24
    accumulators. The tile drawn here lies wholly in the innermost level (the level above it is 1 on
    every axis), ends the last (vectorized) axis in whole vectors, keeps 3/8 to 3/4 of the vector
    registers in accumulators (enough independent chains to hide the FMA latency with slack, operands in
    the rest, no spills) and spans at least 2 rows and 2 vectors, so that one k step loads rows + vectors
    operands for rows x vectors FMAs (16x1 and 1x16 load one operand per FMA and are load-bound).
    GMM 1024 (AVX-512, 32 registers, B packed, NumPy ~315 GFLOP/s on that run): 8x32 in the innermost
    level 358 GFLOP/s; the same 8x32 with 8 rows or 2 vectors one level out 199-238; 16x16 ~290."""
    lanes = hw.float_lanes
    lo, hi = hw.vector_registers * 3 // 8, hw.vector_registers * 3 // 4
    if splits[-1].extent % lanes:
        return [s.lengths for s in splits]
    innermost = [[t for t in policy.factorizations(s.extent, len(s.lengths)) if all(x == 1 for x in t[1:-1])]
                 for s in splits]
    innermost[-1] = [t for t in innermost[-1] if t[-1] % lanes == 0]
    if not all(innermost):
        return [s.lengths for s in splits]
    for _ in range(tries):
        lengths = [c[int(rng.integers(len(c)))] for c in innermost]
        rows, vectors = math.prod(t[-1] for t in lengths[:-1]), lengths[-1][-1] // lanes
        if lo <= rows * vectors <= hi and rows >= 2 and vectors >= 2:
            return lengths
    return [s.lengths for s in splits]


# ---------------------------------------------------------------------------------------------
# annotations


def _attach_points(state: State) -> set[tuple[str, str]]:
    return {s.attach for s in state.stages if s.attach}


def location_candidates(state: State, i: int) -> list[str]:
    """Iterators of stage i's single consumer to compute it at (Ansor's GetComputeLocationCandidates):
    outer space loops, through the reduction tiles of a tiled consumer, never into its inner tiles.

    A pure copy (an operand packed at run time) is never put under a loop whose iterations all read the
    same part of it: it would be copied again on each of them. Of 4,685 measured GMM 1024 programs, the
    163 at >= 280 GFLOP/s all pack B at the root; packed inside the tiles (under an i loop) none passed 271.
    """
    consumers = state.effective_consumers(state.stages[i].name)
    if len(consumers) != 1:
        return []
    target = state.stage(consumers[0])
    tiled = is_tiled(state, state.stage_id(target.name))
    attached_elsewhere = target.location == "at"
    copied = _copied_axes(state.stages[i], target)
    if copied is not None and attached_elsewhere:
        return []  # the consumer's own place is inside loops of another stage: assume they repeat the copy
    roots = _leaf_roots(target) if copied is not None else {}
    points = _attach_points(state)
    out, seen_reduce = [], False
    for it in target.iters:
        if it.kind == "reduce":
            seen_reduce = True
            if not tiled:
                break
        elif seen_reduce or it.annotation == "unroll":
            break
        if it.extent == 1 or (attached_elsewhere and it.kind == "spatial" and it.name.endswith("_0")):
            continue
        if copied is not None and not roots.get(it.name, set()) <= copied:
            break
        out.append(it.name)
        if (target.name, it.name) in points:
            break
    return out


def _copied_axes(stage: Stage, consumer: Stage) -> set[str] | None:
    """The consumer's axes that index `stage` (or have one iteration) when `stage` is a pure copy of
    another tensor, else None."""
    if not isinstance(stage.tensor.body, Load):
        return None
    t = consumer.tensor
    return {v.name for load in walk(t.body) if isinstance(load, Load) and load.tensor.name == stage.name
            for index in load.indices for v in walk(index) if isinstance(v, Var)} | \
        {a.name for a in (*t.axes, *t.reduce_axes) if a.extent == 1}


def _leaf_roots(stage: Stage) -> dict[str, set[str]]:
    """The root axes each of the stage's loops (leaf or intermediate) iterates over."""
    roots = {name: {name} for name in stage.root_names}
    for rel in stage.relations:
        if isinstance(rel, Split):
            roots.update({child: roots.get(rel.parent, set()) for child in rel.children})
        else:
            roots[rel.child] = set().union(*(roots.get(p, set()) for p in rel.parents))
    return roots


def change_compute_location(state: State, rng: np.random.Generator) -> None:
    """Move each untiled, non-output stage to root, inline (no reduction) or one of its candidates."""
    for i in range(len(state.stages) - 1, -1, -1):
        st = state.stages[i]
        if st.is_placeholder or st.location == "inline" or is_output(state, i):
            continue
        if is_tiled(state, i) or has_data_reuse(state, i):
            continue
        where = location_candidates(state, i)
        choice = int(rng.integers(len(where) + 2))
        try:
            if choice == 0 and st.location != "root":
                state.compute_root(i)
            elif choice == 1 and not isinstance(st.tensor.body, Reduce):
                state.compute_inline(i)
            elif choice >= 2:
                state.compute_at(i, state.stage_id(state.effective_consumers(st.name)[0]), where[choice - 2])
        except ScheduleError:
            pass  # leaves the state as it was


def annotate_parallel(state: State, cores: int, rng: np.random.Generator, policy: AnnotationPolicy) -> None:
    """Fuse a random prefix of each root stage's outer space loops (at least enough for every core
    where possible, at most up to cores * parallel_per_core or an attach point) and parallelize it."""
    for i, st in enumerate(state.stages):
        if st.is_placeholder or st.location != "root":
            continue
        points = _attach_points(state)
        prefix, degree = [], 1
        for it in st.iters:
            if it.kind != "spatial" or it.annotation != "none" or it.extent is None:
                break
            prefix.append(it)
            degree *= it.extent
            if degree > cores * policy.parallel_per_core or (st.name, it.name) in points:
                break
        if not prefix:
            continue
        extents = np.cumprod([it.extent for it in prefix])
        lo = next((k + 1 for k, e in enumerate(extents) if e >= cores), len(prefix))
        k = int(rng.integers(lo, len(prefix) + 1))
        if extents[k - 1] == 1:
            continue  # nothing to share out
        names = [it.name for it in prefix[:k]]
        if len(names) > 1:
            state.fuse(i, names)
            state.parallel(i, state.stages[i].iters[0].name)
        else:
            state.parallel(i, names[0])


def annotate_unroll(state: State, rng: np.random.Generator, policy: AnnotationPolicy) -> None:
    """auto_unroll_max_step on the outermost loop of every stage with a reduction (Ansor's InitUnroll)."""
    for i, st in enumerate(state.stages):
        if st.is_placeholder or st.location == "inline" or not any(it.kind == "reduce" for it in st.iters):
            continue
        value = policy.unroll_steps[int(rng.integers(len(policy.unroll_steps)))]
        state.pragma(i, st.iters[0].name, f"auto_unroll_max_step${value}")


def annotate_vectorize(state: State, rng: np.random.Generator, policy: AnnotationPolicy) -> None:
    """Vectorize the innermost space loop (or, in untiled stages, a random run of innermost loops
    fused) when it is unannotated, not an attach point and at most max_vectorize long; an untiled
    stage's innermost loop is vectorized whatever its length, a tiled stage's when it is whole
    max_vectorize-lane vectors (a register tile 32 or 64 wide: codegen emits one operation per vector;
    left serial, the 8x32 GMM tile that beats NumPy was reachable only by mutating a 16-wide one)."""
    points = _attach_points(state)
    for i, st in enumerate(state.stages):
        if st.is_placeholder or st.location == "inline":
            continue
        tiled = is_tiled(state, i)
        run, length, whole = 0, 1, False
        for it in reversed(st.iters):
            if (st.name, it.name) in points or it.kind != "spatial" or it.annotation != "none":
                break
            if it.extent is None or (tiled and run > 0):
                break
            length *= it.extent
            if length > policy.max_vectorize:
                # codegen steps a long loop by whole vectors: an element-wise op's erf, exp, tanh run in
                # libmvec's vector versions, which gcc never calls for a scalar loop (GELU 5x faster)
                whole = run == 0 and (not tiled or length % policy.max_vectorize == 0)
                break
            run += 1
        if whole:
            run = 1
        elif run == 0:
            continue
        else:
            run = int(rng.integers(1, run + 1))
        names = [it.name for it in st.iters[len(st.iters) - run:]]
        if run > 1:
            state.fuse(i, names)
        state.vectorize(i, state.stages[i].iters[-1].name)


def sample_state(task: SearchTask, sketch: State, rng: np.random.Generator,
                 policy: AnnotationPolicy | None = None) -> State:
    """One random complete program from `sketch` (may raise ScheduleError/LoweringError if invalid)."""
    policy = policy or AnnotationPolicy()
    state = fill_tile_sizes(sketch, rng, policy, task.hw if task.target.kind == "cpu" else None)
    change_compute_location(state, rng)
    annotate_parallel(state, task.hw.cores, rng, policy)
    if task.dag.flop_count >= policy.min_parallel_flops and starves_cores(state, task.hw.cores):
        raise ScheduleError("the sampled tile sizes leave no outer loop to run on every core")
    annotate_unroll(state, rng, policy)
    annotate_vectorize(state, rng, policy)
    return state


def starves_cores(state: State, cores: int) -> bool:
    """A tiled root stage has no parallel loop of `cores` iterations although its space has them.

    Its tile sizes put every factor inside the loops that may be fused and parallelized (those before
    an attach point), so the program runs on one core. Such samples are drawn often (ResNet-50's fc,
    1000 outputs in 4 tile levels, sampled j_0 = 1 in every program of its first rounds) and are never
    what a sizeable program wants; the sampler draws other tile sizes instead."""
    for i, st in enumerate(state.stages):
        if st.is_placeholder or st.location != "root" or not is_tiled(state, i):
            continue
        if any(it.annotation == "parallel" and (it.extent or 0) >= cores for it in st.iters):
            continue
        space = math.prod(it.extent or 1 for it in st.iters if it.kind == "spatial")
        if space >= cores:
            return True
    return False


def is_valid(state: State) -> bool:
    """The state lowers to a complete loop program."""
    try:
        lower(state)
    except (LoweringError, ScheduleError):
        return False
    return True


def shares_work(state: State) -> bool:
    """No parallel loop has a single iteration. A tile-size mutation can move every factor out of the
    fused parallel loop, and the program then runs on one core: evolution kept 12 such best programs
    for MobileNet-V2's 7x7 and 14x14 layers (its 1x1 320->1280 conv ran at 100 GFLOP/s, a parallel
    program of it at 137). TileSizeMutation refuses that move; rejecting every such child, whatever its
    parent, would also block all descendants of a parent that already has one (an adapted transfer seed)."""
    return all(it.extent != 1 for st in state.stages for it in st.iters if it.annotation == "parallel")


def sample_initial_population(task: SearchTask, sketches: Sequence[State], n: int, rng: np.random.Generator,
                              policy: AnnotationPolicy | None = None, max_tries: int | None = None,
                              validate: Callable[[list[State]], list[bool]] | None = None,
                              skips: Skips | None = None, sample: Sampler | None = None) -> list[State]:
    """`n` valid random programs from uniformly picked sketches (fewer only if `max_tries`, default
    10 * n, samples are mostly invalid). Duplicates are kept: the population is a multiset.
    `validate` checks a batch at once, so that a caller that lowers anyway (the feature extractor)
    checks validity in the same vectorized pass; the default lowers each state. `sample` draws one program of
    a sketch (default: `sample_state`, a CPU's; search.targets has each target kind's). A sample that raises
    otherwise than ScheduleError (a bug) is skipped and counted in `skips`."""
    if not sketches:
        raise ValueError("sample_initial_population: no sketches to sample from")
    policy = policy or AnnotationPolicy()
    validate = validate or (lambda states: [is_valid(s) for s in states])
    sample = sample or sample_state
    skips = skips if skips is not None else Skips()
    out: list[State] = []
    tries = 0
    limit = 10 * n if max_tries is None else max_tries
    while len(out) < n and tries < limit:
        batch = []
        for _ in range(min(n - len(out), limit - tries)):
            tries += 1
            sketch = sketches[int(rng.integers(len(sketches)))]
            with skips.guard("random annotation", str(task)):
                try:
                    batch.append(sample(task, sketch, rng, policy))
                except ScheduleError:
                    continue
        out += [s for s, ok in zip(batch, validate(batch)) if ok]
    return out
