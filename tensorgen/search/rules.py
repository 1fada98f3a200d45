"""Sketch derivation rules (Ansor Table 1, CPU): small classes with a condition and an application.

A rule looks at the derivation state (S, i) — a State and the index of the stage being worked on —
and says whether it applies (`Cond`). Its application returns the next derivation states
[(S', i'), ...] with i' <= i; returning several is how one rule offers alternatives (e.g. two
fusion levels). The ordered table `DEFAULT_RULES` mirrors Ansor's CPU order (a tuple: nobody changes it for
everyone); `with_rule` / `without_rule` make a new table, which a caller passes to `generate_sketches` or
to a policy (`SketchPolicy(rules=...)`, `tune(policy_options={"rules": ...})`).

Predicates are evaluated on the *state's* stages, not only on the DAG's, because rules create
stages (cache_write's `<name>_local`, rfactor's `<name>_rf`) that later rules must see.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from tensorgen.dag import ComputeDAG, at_own_axes
from tensorgen.errors import ScheduleError
from tensorgen.schedule.packing import interleaves
from tensorgen.schedule.stage import Split
from tensorgen.schedule.state import State
from tensorgen.te.expr import Load, Reduce, walk

if TYPE_CHECKING:
    from tensorgen.task import SearchTask

Derivation = tuple[State, int]


class Cond(enum.Enum):
    """What a rule's condition answers for (S, i)."""

    SKIP = 0
    APPLY = 1
    APPLY_AND_SKIP_REST = 2


# ---------------------------------------------------------------------------------------------
# predicates on a state's stage


_RULE_MADE: dict[tuple[str, str, str, tuple[int, ...]], ComputeDAG] = {}


def stage_analysis(state: State, i: int) -> ComputeDAG:
    """A DAG on which the dag predicates can be asked about stage i (one of its own for rule-made
    stages, memoized by what they compute: replay rebuilds their tensors for every state)."""
    st = state.stages[i]
    if state.dag.by_name.get(st.name) is st.tensor:
        return state.dag
    key = (state.dag.workload_key, st.name, st.body_text, st.tensor.shape)
    dag = _RULE_MADE.get(key)
    if dag is None:
        if len(_RULE_MADE) > 1024:
            _RULE_MADE.clear()
        dag = _RULE_MADE[key] = ComputeDAG(st.tensor)
    return dag


def is_compute(state: State, i: int) -> bool:
    st = state.stages[i]
    return not st.is_placeholder and st.location != "inline"


def is_output(state: State, i: int) -> bool:
    return state.dag.is_output(state.stages[i].name)


def has_data_reuse(state: State, i: int) -> bool:
    """Ansor's NeedsMultiLevelTiling: compute-intensive with reuse (matmul, conv)."""
    return is_compute(state, i) and stage_analysis(state, i).has_data_reuse(state.stages[i].name)


def is_strict_inlinable(state: State, i: int) -> bool:
    return is_compute(state, i) and stage_analysis(state, i).is_strict_inlinable(state.stages[i].name)


def is_transpose(state: State, i: int) -> bool:
    """Stage i only moves data, and its innermost axis walks a non-innermost dimension of the source:
    inlined, a tiled consumer would read that source with a large stride in its vectorized loop."""
    t = state.stages[i].tensor
    body = t.body
    if not is_compute(state, i) or not isinstance(body, Load) or not t.axes or not body.indices:
        return False
    inner = t.axes[-1]
    in_last = any(n is inner for n in walk(body.indices[-1]))
    elsewhere = any(n is inner for idx in body.indices[:-1] for n in walk(idx))
    return elsewhere and not in_last


def is_tiled(state: State, i: int) -> bool:
    return any(isinstance(r, Split) for r in state.stages[i].relations)


def _reads_elementwise(state: State, producer: str, consumer: str) -> bool:
    """`consumer` is injective, has `producer`'s shape and reads it only at its own axes."""
    p, c = state.stage(producer).tensor, state.stage(consumer).tensor
    if c.is_placeholder or isinstance(c.body, Reduce) or c.shape != p.shape:
        return False
    reads = [n for n in walk(c.body) if isinstance(n, Load) and n.tensor.name == producer]
    return all(at_own_axes(n.indices, c.axes) for n in reads)


def fusible_consumer(state: State, i: int) -> int | None:
    """Index of the single (through inlined stages) element-wise consumer stage i can be fused into."""
    name = state.stages[i].name
    if is_output(state, i):
        return None
    targets = state.effective_consumers(name)
    if len(targets) != 1:
        return None

    def matched(p: str, c: str) -> bool:
        if not _reads_elementwise(state, p, c):
            return False
        return c == targets[0] or all(matched(c, cc) for cc in state.consumers(c))

    return state.stage_id(targets[0]) if all(matched(name, c) for c in state.consumers(name)) else None


def is_cache_write_stage(state: State, i: int) -> bool:
    """Stage i was made by cache_write: the next stage is the plain copy of it."""
    if i + 1 >= len(state.stages):
        return False
    body = state.stages[i + 1].tensor.body
    return isinstance(body, Load) and body.tensor is state.stages[i].tensor


# ---------------------------------------------------------------------------------------------
# the transformations the rules share


def multi_level_tiling(state: State, i: int, structure: str = "SSRSRS") -> tuple[State, list[int]]:
    """Split every spatial loop into structure.count('S') parts and every reduce loop into
    count('R') parts (all lengths unfilled), reordered level by level as `structure` says.

    Returns the new state and the step ids of the spatial splits, in iterator order (for follow_split).
    """
    s = state.copy()
    name = s.stages[i].name
    n_space, n_reduce = structure.count("S"), structure.count("R")
    levels: dict[str, list[list[str]]] = {"S": [[] for _ in range(n_space)], "R": [[] for _ in range(n_reduce)]}
    space_split_ids: list[int] = []
    for it in state.stages[i].iters:
        key = "R" if it.kind == "reduce" else "S"
        n = n_space if key == "S" else n_reduce
        if n == 0:
            raise ScheduleError(f"tiling structure {structure!r} has no level for {key} iterator {it.name}")
        if n == 1:
            levels[key][0].append(it.name)
            continue
        s.split(i, it.name, [None] * (n - 1))
        if key == "S":
            space_split_ids.append(len(s.steps) - 1)
        pos = s.stages[i].iter_index(s.stages[i].relations[-1].children[0])
        for lvl, child in enumerate(s.stages[i].iters[pos:pos + n]):
            levels[key][lvl].append(child.name)
    seen = {"S": 0, "R": 0}
    order: list[str] = []
    for c in structure.upper():
        order += levels[c][seen[c]]
        seen[c] += 1
    s.reorder(name, order)
    return s, space_split_ids


def follow_tiling(state: State, consumer: int, split_ids: list[int], level: int) -> tuple[State, str]:
    """Split the consumer's spatial loops like the producer's first `level` tile levels.

    Returns the new state and the consumer iterator the producer should be computed at.
    """
    s = state.copy()
    iters = [it.name for it in s.stages[consumer].iters]
    spatial = [n for n in iters if s.stages[consumer].iters[s.stages[consumer].iter_index(n)].kind == "spatial"]
    if len(spatial) != len(split_ids) or len(spatial) != len(iters):
        raise ScheduleError("follow_tiling: the consumer's loops do not match the producer's spatial splits")
    parts: list[list[str]] = [[] for _ in range(level + 1)]
    for name, sid in zip(spatial, split_ids):
        s.follow_split(consumer, name, sid, level)
        st = s.stages[consumer]
        pos = st.iter_index(st.relations[-1].children[0])
        for lvl, child in enumerate(st.iters[pos:pos + level + 1]):
            parts[lvl].append(child.name)
    order = [n for p in parts for n in p]
    s.reorder(consumer, order)
    return s, parts[level - 1][-1]


# ---------------------------------------------------------------------------------------------
# rules


class SketchRule:
    """Base of derivation rules; subclasses set `name` and implement `condition` and `apply`."""

    name: ClassVar[str] = "rule"

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        raise NotImplementedError

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class AlwaysInline(SketchRule):
    """Rule 2: element-wise stages without branches or expensive calls cost nothing to inline; not `strict`
    (a GPU's), every non-output stage without a reduction is inlined (a kernel launch costs more)."""

    name = "always_inline"

    def __init__(self, strict: bool = True):
        self.strict = strict

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        if is_output(state, i):
            return Cond.SKIP
        ok = is_strict_inlinable(state, i) if self.strict else \
            is_compute(state, i) and not isinstance(state.stages[i].tensor.body, Reduce)
        return Cond.APPLY_AND_SKIP_REST if ok else Cond.SKIP

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        return [(state.copy().compute_inline(i), i - 1)]


#: compute attribute naming the axes that index small constant tensors (e.g. Winograd's matrices)
CONST_TENSOR_INDICES = "const_tensor_indices"


class SimplifyComputeWithConstTensor(SketchRule):
    """Ansor's rule for stages that read small constant tensors by some axes (a Winograd transform's
    matrices, declared by the op in `attrs[CONST_TENSOR_INDICES]`): those loops are unrolled innermost,
    so every constant becomes a literal the compiler folds, and the other loops are tiled in two levels."""

    name = "simplify_compute_with_const_tensor"

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        st = state.stages[i]
        ok = not st.is_placeholder and st.location != "inline" and st.tensor.attrs.get(CONST_TENSOR_INDICES)
        return Cond.APPLY_AND_SKIP_REST if ok else Cond.SKIP

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        s = state.copy()
        const = set(s.stages[i].tensor.attrs[CONST_TENSOR_INDICES])
        outer, inner, unrolled = [], [], []
        for name in [it.name for it in s.stages[i].iters]:
            if name in const:
                unrolled.append(name)
                continue
            k = s.stages[i].iter_index(name)
            s.split(i, name, [None])
            outer.append(s.stages[i].iters[k].name)
            inner.append(s.stages[i].iters[k + 1].name)
        s.reorder(i, outer + inner + unrolled)
        for name in unrolled:
            s.unroll(i, name)
        return [(s, i - 1)]


class InlineOrMaterializeTranspose(SketchRule):
    """A transposing copy read by a tiled stage is either inlined (no copy; strided reads) or kept as
    its own stage (one copy; the consumer reads it contiguously): both are sketches. Not in Ansor's
    Table 1 (which always inlines); attention needs it for K^T (TBS 128x12x64, 64 trials: 4.3 -> 23 GFLOP/s)."""

    name = "inline_or_materialize_transpose"

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        if is_output(state, i) or not is_strict_inlinable(state, i) or not is_transpose(state, i):
            return Cond.SKIP
        consumers = state.effective_consumers(state.stages[i].name)
        tiled = any(has_data_reuse(state, state.stage_id(c)) for c in consumers)
        return Cond.APPLY_AND_SKIP_REST if tiled else Cond.SKIP

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        return [(state.copy().compute_inline(i), i - 1), (state, i - 1)]


def split_reduction(state: State, i: int) -> tuple[State, tuple[str, str], int]:
    """Stage i's reduce loops fused and split in two by a placeholder length 1 (rfactor needs a known shape;
    annotation samples it like any tile size): the new state, the two parts and the number of space loops."""
    base = state.copy()
    st = base.stages[i]
    reduce = [it.name for it in st.iters if it.kind == "reduce"]
    n_space = sum(it.kind != "reduce" for it in st.iters)
    if len(reduce) > 1:
        base.fuse(i, reduce)
    fused = [it.name for it in base.stages[i].iters if it.kind == "reduce"][0]
    base.split(i, fused, [1])
    outer, inner = base.stages[i].relations[-1].children
    return base, (outer, inner), n_space


class AddRfactor(SketchRule):
    """Rule 6: little space parallelism but a long reduction -> factor the reduction into a space axis.

    The fused reduction is split in two and either part becomes the rf stage's new space axis
    (outer part: parallelism; inner part, reordered innermost: vectorization). The split length is
    a placeholder 1 because rfactor needs a known shape; `annotate` samples it like any tile size.
    """

    name = "add_rfactor"

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        if not is_compute(state, i) or not isinstance(state.stages[i].tensor.body, Reduce):
            return Cond.SKIP
        needs = stage_analysis(state, i).needs_rfactor(state.stages[i].name, task.hw.cores)
        return Cond.APPLY if needs and not is_cache_write_stage(state, i) else Cond.SKIP

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        base, (outer, inner), n_space = split_reduction(state, i)
        out = []
        for part in (outer, inner):
            s = base.copy().rfactor(i, part, n_space)
            if part == inner:  # the new space axis innermost, for vectorization
                names = [it.name for it in s.stages[i].iters]
                s.reorder(i, names[:n_space] + names[n_space + 1:] + [names[n_space]])
            out.append((s, i - 1))
        return out


class AddCacheWrite(SketchRule):
    """Rule 5: a tiled stage without a fusible consumer writes through a local cache stage, which
    then gets tiled with fusion into the copy (the derivation stays at i, now the cache stage)."""

    name = "add_cache_write"

    def __init__(self, skip_rest: bool = False):
        self.skip_rest = skip_rest  # a GPU's: no sketch without the cache stage

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        ok = has_data_reuse(state, i) and fusible_consumer(state, i) is None and not is_tiled(state, i)
        return (Cond.APPLY_AND_SKIP_REST if self.skip_rest else Cond.APPLY) if ok else Cond.SKIP

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        return [(state.copy().cache_write(i, "local"), i)]


class MultiLevelTilingWithFusion(SketchRule):
    """Rule 4: tile, then split the element-wise consumer like the producer's outer `levels` and
    compute the producer at the consumer's last loop of that level (one sketch per level)."""

    name = "multi_level_tiling_with_fusion"

    def __init__(self, structure: str = "SSRSRS", levels: tuple[int, ...] = (1, 2), skip_rest: bool = False):
        self.structure, self.levels = structure, levels
        self.skip_rest = skip_rest  # a GPU's: never offer the stage unfused

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        if not has_data_reuse(state, i) or fusible_consumer(state, i) is None:
            return Cond.SKIP
        # a cache stage exists only to be fused: don't also offer it unfused
        return Cond.APPLY_AND_SKIP_REST if self.skip_rest or is_cache_write_stage(state, i) else Cond.APPLY

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        consumer = fusible_consumer(state, i)
        assert consumer is not None
        tiled, split_ids = multi_level_tiling(state, i, self.structure)
        out = []
        for level in self.levels:
            if self.structure.upper()[level - 1] != "S":
                continue
            s, at = follow_tiling(tiled, consumer, split_ids, level)
            out.append((s.compute_at(i, consumer, at), i - 1))
        return out


class MultiLevelTiling(SketchRule):
    """Rule 3: "SSRSRS" tiling of a stage with data reuse (the tile sizes are left to annotation)."""

    name = "multi_level_tiling"

    def __init__(self, structure: str = "SSRSRS"):
        self.structure = structure

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        return Cond.APPLY_AND_SKIP_REST if has_data_reuse(state, i) and not is_tiled(state, i) else Cond.SKIP

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        return [(multi_level_tiling(state, i, self.structure)[0], i - 1)]


def streams(state: State, i: int, t_name: str) -> bool:
    """Stage i reads tensor `t_name` along its last spatial axis in `t_name`'s contiguous dimension:
    the operand its vectorized inner loop loads vectors of (GMM's B; A is broadcast)."""
    t = state.stages[i].tensor
    loads = [n for n in walk(t.body) if isinstance(n, Load) and n.tensor.name == t_name]
    return bool(t.axes) and any(n.indices and n.indices[-1] is t.axes[-1] for n in loads)


class PackOperand(SketchRule):
    """An input that is not constant and larger than a quarter of the core's L2, streamed by a tiled stage
    (`streams`) whose tile levels interleave its dimensions, is either read where it is or first copied
    into the reader's tile layout (schedule/packing.py: the packing a BLAS does; a constant gets this
    layout at build time instead): both are sketches. Not in Ansor's Table 1; GMM 1024 needs it to read
    B's column panels contiguously (and aligned); GMM 512's 1 MB B (L2 2 MB), same tiles: 273 -> 294
    GFLOP/s. A smaller operand stays in cache between its reuses, where packing buys little for its
    doubled sketches (C2D 56x56 3x3's 147 KB weight: 2800 states scored per second unpacked, 1700
    with); the broadcast operand is left alone."""

    name = "pack_operand"

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        st = state.stages[i]
        if not st.is_placeholder or st.tensor.attrs.get("constant"):
            return Cond.SKIP
        if math.prod(st.tensor.shape) * np.dtype(st.tensor.dtype).itemsize <= task.hw.l2_bytes // 4:
            return Cond.SKIP
        readers = state.consumers(st.name)
        if len(readers) != 1:
            return Cond.SKIP
        r = state.stage_id(readers[0])
        ok = (is_tiled(state, r) and has_data_reuse(state, r) and streams(state, r, st.name)
              and interleaves(state.stages[r], st.tensor))
        return Cond.APPLY_AND_SKIP_REST if ok else Cond.SKIP

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        reader = state.consumers(state.stages[i].name)[0]
        return [(state, i - 1), (state.copy().pack_layout(i, reader), i - 1)]


class SkipStage(SketchRule):
    """Rule 1: leave the stage as it is and move on (always applies, so derivation never stalls)."""

    name = "skip_stage"

    def condition(self, task: SearchTask, state: State, i: int) -> Cond:
        return Cond.APPLY

    def apply(self, task: SearchTask, state: State, i: int) -> list[Derivation]:
        return [(state, i - 1)]


DEFAULT_RULES: tuple[SketchRule, ...] = (
    InlineOrMaterializeTranspose(),
    AlwaysInline(),
    SimplifyComputeWithConstTensor(),
    AddRfactor(),
    AddCacheWrite(),
    MultiLevelTilingWithFusion(),
    MultiLevelTiling(),
    PackOperand(),
    SkipStage(),
)


def _position(rules: Sequence[SketchRule], ref: SketchRule | type | str) -> int:
    for n, r in enumerate(rules):
        if r is ref or r.name == ref or (isinstance(ref, type) and isinstance(r, ref)):
            return n
    raise KeyError(f"no rule {ref!r} in {[r.name for r in rules]}")


def with_rule(rule: SketchRule, before: SketchRule | type | str | None = None,
              rules: Sequence[SketchRule] = DEFAULT_RULES) -> tuple[SketchRule, ...]:
    """A new table: `rules` with `rule` before `before` (a rule, class or name); by default just before
    SkipStage, so it sees every stage that no APPLY_AND_SKIP_REST rule took."""
    table = list(rules)
    if before is None:
        before = SkipStage if any(isinstance(r, SkipStage) for r in table) else None
    table.insert(len(table) if before is None else _position(table, before), rule)
    return tuple(table)


def without_rule(rule: SketchRule | type | str, rules: Sequence[SketchRule] = DEFAULT_RULES) -> tuple[SketchRule, ...]:
    """A new table: `rules` without a rule (named by instance, class or name)."""
    n = _position(rules, rule)
    return (*rules[:n], *rules[n + 1:])
