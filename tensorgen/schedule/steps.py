"""Transform steps: each is small data that applies to a State, serializes to JSON and prints as Python.

Steps address stages and iterators by index (as Ansor does), so a step list replays on any copy of
the DAG; printing resolves indices to names, so the printed program is runnable against a State.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, ClassVar

from tensorgen.errors import ScheduleError
from tensorgen.memo import by_identity
from tensorgen.schedule.relations import derive, split_extents
from tensorgen.schedule.stage import ANNOTATIONS, Fuse, Iterator, Split, Stage, make_stage
from tensorgen.te.expr import Load, Reduce, Var, all_of, substitute, transform
from tensorgen.te.tensor import Tensor

if TYPE_CHECKING:
    from tensorgen.dag import ComputeDAG
    from tensorgen.schedule.state import State

STEP_TYPES: dict[str, type[Step]] = {}


def register_step(cls: type[Step]) -> type[Step]:
    STEP_TYPES[cls.code] = cls
    return cls


@dataclass(frozen=True)
class Step:
    code: ClassVar[str] = ""
    #: where a step that adds a stage puts it, relative to `stage_id` (later stages shift up by one)
    new_stage_offset: ClassVar[int | None] = None
    stage_id: int

    def apply(self, state: State) -> tuple[Stage, ...]:
        """The stages after this step; must not modify `state`."""
        raise NotImplementedError

    def shifted(self, offset: int) -> Step:
        """This step after `offset` more steps come before it (a step naming earlier steps by index renumbers)."""
        return self

    def new_dag(self, state: State) -> ComputeDAG | None:
        """The DAG the state computes after this step, when the step changes it (a tensor's layout); else None."""
        return None

    def to_json(self) -> list:
        values = (getattr(self, f.name) for f in fields(self))  # flat: astuple's deep copy costs 8x as much
        return [self.code, *(list(v) if isinstance(v, tuple) else v for v in values)]

    @staticmethod
    def from_json(data: list) -> Step:
        if not isinstance(data, list) or not data or data[0] not in STEP_TYPES:
            raise ScheduleError(f"not a serialized step: {data!r}")
        cls = STEP_TYPES[data[0]]
        args = [tuple(v) if isinstance(v, list) else v for v in data[1:]]
        return cls(*args)

    def to_python(self, state: State) -> str:
        raise NotImplementedError


def stage_at(state: State, stage_id: int) -> Stage:
    """The stage `stage_id` of `state`; ScheduleError when there is none."""
    if not isinstance(stage_id, int) or not 0 <= stage_id < len(state.stages):
        raise ScheduleError(f"no stage with index {stage_id} (the state has {len(state.stages)} stages)")
    return state.stages[stage_id]


def compute_stage(state: State, stage_id: int, what: str) -> Stage:
    """The stage `stage_id`, which must have loops of its own (`what`: the step asking, for the error)."""
    st = stage_at(state, stage_id)
    if st.is_placeholder:
        raise ScheduleError(f"{what}: {st.name} is an input placeholder and has no loops to transform")
    if st.location == "inline":
        raise ScheduleError(f"{what}: stage {st.name} is inlined and has no loops of its own")
    return st


def _replace(stages: tuple[Stage, ...], index: int, new: Stage) -> tuple[Stage, ...]:
    return stages[:index] + (new,) + stages[index + 1:]


def _reattach(stages: tuple[Stage, ...], stage: str, old: tuple[str, ...], new: str) -> tuple[Stage, ...]:
    """Stages attached at any of `old` iterators of `stage` move to iterator `new` (the same tuple
    when none is: replay calls this for every split of every state the search builds)."""
    out = None
    for k, s in enumerate(stages):
        at = s.attach
        if at is not None and at[0] == stage and at[1] in old:
            out = out or list(stages)
            out[k] = s.with_(attach=(stage, new))
    return stages if out is None else tuple(out)


def call_line(method: str, *args) -> str:
    """One line of the printed program: `s.method(arg, ...)` with Python literals."""
    return f"s.{method}({', '.join(repr(list(a) if isinstance(a, tuple) else a) for a in args)})"


def _names(state: State, stage_id: int, iter_id: int) -> tuple[str, str]:
    st = state.stages[stage_id]
    return st.name, st.iters[iter_id].name


# ---------------------------------------------------------------------------------------------
# loop transformations


@register_step
@dataclass(frozen=True)
class SplitStep(Step):
    code: ClassVar[str] = "SP"
    iter_id: int
    extent: int | None
    lengths: tuple[int | None, ...]
    inner_to_outer: bool = True

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "split")
        idx = st.iter_index(self.iter_id)
        return _do_split(state.stages, self.stage_id, st, idx, tuple(self.lengths), self.inner_to_outer)

    def to_python(self, state: State) -> str:
        line = call_line("split", *_names(state, self.stage_id, self.iter_id), self.lengths)
        return line if self.inner_to_outer else line[:-1] + ", inner_to_outer=False)"


def _do_split(stages, stage_id, st: Stage, idx: int, lengths, inner_to_outer: bool):
    it = st.iters[idx]
    if not lengths:
        raise ScheduleError(f"split of {st.name}.{it.name}: give at least one length")
    for n in lengths:
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n <= 0):
            raise ScheduleError(f"split of {st.name}.{it.name}: lengths must be positive integers, got {n!r}")
    if it.extent is not None and None not in lengths and math.prod(lengths) > it.extent:
        raise ScheduleError(
            f"split of {st.name}.{it.name}: the lengths {list(lengths)} multiply to {math.prod(lengths)}, "
            f"more than the iterator's extent {it.extent}"
        )
    extents = split_extents(it.extent, lengths, inner_to_outer)
    names = st.fresh_names(*(f"{it.name}_{k}" for k in range(len(extents))))
    new_iters = tuple(Iterator(n, e, it.kind) for n, e in zip(names, extents))
    rel = Split(it.name, tuple(names), tuple(lengths), inner_to_outer)
    new = st.with_(iters=st.iters[:idx] + new_iters + st.iters[idx + 1:], relations=st.relations + (rel,))
    return _reattach(_replace(stages, stage_id, new), st.name, (it.name,), names[-1])


def _follow_lengths(state: State, src_step_id: int, n_split: int) -> tuple[int | None, ...]:
    src = _split_step(state, src_step_id)
    if not 1 <= n_split <= len(src.lengths):
        raise ScheduleError(f"follow_split: n_split {n_split} must be in 1..{len(src.lengths)}")
    head = list(src.lengths[: n_split - 1])
    tail = src.lengths[n_split - 1:]
    last = None if None in tail else math.prod(tail)
    return tuple(head + [last])


def _split_step(state: State, step_id: int) -> SplitStep:
    if not 0 <= step_id < len(state.steps) or not isinstance(state.steps[step_id], SplitStep):
        raise ScheduleError(f"step {step_id} is not a split step of this state")
    return state.steps[step_id]


@register_step
@dataclass(frozen=True)
class FollowSplitStep(Step):
    """Split like an earlier split step (its first n_split-1 lengths, the rest merged)."""

    code: ClassVar[str] = "FSP"
    iter_id: int
    src_step_id: int
    n_split: int

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "follow_split")
        lengths = _follow_lengths(state, self.src_step_id, self.n_split)
        return _do_split(state.stages, self.stage_id, st, st.iter_index(self.iter_id), lengths, True)

    def shifted(self, offset: int) -> Step:
        return replace(self, src_step_id=self.src_step_id + offset)

    def to_python(self, state: State) -> str:
        return call_line("follow_split", *_names(state, self.stage_id, self.iter_id), self.src_step_id, self.n_split)


@register_step
@dataclass(frozen=True)
class FollowFusedSplitStep(Step):
    """Split by the product of level `level` of several earlier splits (for fused loops)."""

    code: ClassVar[str] = "FFSP"
    iter_id: int
    src_step_ids: tuple[int, ...]
    level: int
    factor_or_nparts: bool

    def shifted(self, offset: int) -> Step:
        return replace(self, src_step_ids=tuple(i + offset for i in self.src_step_ids))

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "follow_fused_split")
        length: int | None = 1
        for sid in self.src_step_ids:
            src = _split_step(state, sid)
            if not 0 <= self.level < len(src.lengths):
                raise ScheduleError(f"follow_fused_split: level {self.level} out of range for step {sid}")
            value = src.lengths[self.level]
            length = None if value is None or length is None else length * value
        idx = st.iter_index(self.iter_id)
        return _do_split(state.stages, self.stage_id, st, idx, (length,), self.factor_or_nparts)

    def to_python(self, state: State) -> str:
        return call_line("follow_fused_split", *_names(state, self.stage_id, self.iter_id), self.src_step_ids,
                     self.level, self.factor_or_nparts)


@register_step
@dataclass(frozen=True)
class FuseStep(Step):
    code: ClassVar[str] = "FU"
    iter_ids: tuple[int, ...]

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "fuse")
        ids = [st.iter_index(i) for i in self.iter_ids]
        if len(ids) < 2:
            raise ScheduleError(f"fuse on stage {st.name}: give at least two iterators")
        if ids != list(range(ids[0], ids[0] + len(ids))):
            names = [st.iters[i].name for i in ids]
            raise ScheduleError(f"fuse on stage {st.name}: iterators {names} are not consecutive loops")
        its = [st.iters[i] for i in ids]
        kinds = {i.kind for i in its}
        if len(kinds) > 1:
            raise ScheduleError(
                f"fuse on stage {st.name}: cannot fuse spatial and reduce iterators "
                f"({', '.join(f'{i.name}:{i.kind}' for i in its)})"
            )
        extent = None if any(i.extent is None for i in its) else math.prod(i.extent for i in its)
        (name,) = st.fresh_names("_".join(i.name for i in its) + "_f")
        fused = Iterator(name, extent, kinds.pop())
        new = st.with_(
            iters=st.iters[: ids[0]] + (fused,) + st.iters[ids[-1] + 1:],
            relations=st.relations + (Fuse(tuple(i.name for i in its), name),),
        )
        return _reattach(_replace(state.stages, self.stage_id, new), st.name, tuple(i.name for i in its), name)

    def to_python(self, state: State) -> str:
        st = state.stages[self.stage_id]
        return call_line("fuse", st.name, [st.iters[i].name for i in self.iter_ids])


@register_step
@dataclass(frozen=True)
class ReorderStep(Step):
    code: ClassVar[str] = "RE"
    after_ids: tuple[int, ...]

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "reorder")
        ids = [st.iter_index(i) for i in self.after_ids]
        if sorted(ids) != list(range(len(st.iters))):
            raise ScheduleError(
                f"reorder on stage {st.name}: give every iterator exactly once "
                f"({', '.join(i.name for i in st.iters)}), got {[st.iters[i].name for i in ids]}"
            )
        new = st.with_(iters=tuple(st.iters[i] for i in ids))
        for pos, it in enumerate(new.iters):
            if it.annotation == "vectorize" and it.kind != "spatial" and pos != len(new.iters) - 1:
                raise ScheduleError(
                    f"reorder on stage {st.name}: the vectorized reduce iterator {it.name} must stay innermost"
                )
        return _replace(state.stages, self.stage_id, new)

    def to_python(self, state: State) -> str:
        st = state.stages[self.stage_id]
        return call_line("reorder", st.name, [st.iters[i].name for i in self.after_ids])


@register_step
@dataclass(frozen=True)
class AnnotationStep(Step):
    code: ClassVar[str] = "AN"
    iter_id: int
    annotation: str

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "annotate")
        idx = st.iter_index(self.iter_id)
        it = st.iters[idx]
        ann = self.annotation
        if ann not in ANNOTATIONS:
            raise ScheduleError(f"unknown annotation {ann!r}; known: {', '.join(ANNOTATIONS)}")
        where = f"stage {st.name}, iterator {it.name}"
        if ann == "parallel" and it.kind != "spatial":
            raise ScheduleError(f"cannot parallelize {where}: it is a {it.kind} iterator (a data race)")
        if ann == "vectorize" and it.kind != "spatial" and idx != len(st.iters) - 1:
            raise ScheduleError(f"cannot vectorize {where}: a reduce iterator that is not the innermost loop")
        if ann != "none" and it.annotation not in ("none", ann):
            raise ScheduleError(f"{where} is already annotated {it.annotation!r}")
        new = st.with_(iters=_replace(st.iters, idx, Iterator(it.name, it.extent, it.kind, ann)))
        return _replace(state.stages, self.stage_id, new)

    def to_python(self, state: State) -> str:
        names = _names(state, self.stage_id, self.iter_id)
        if self.annotation in ("parallel", "vectorize", "unroll"):
            return call_line(self.annotation, *names)
        return call_line("annotate", *names, self.annotation)


@register_step
@dataclass(frozen=True)
class PragmaStep(Step):
    code: ClassVar[str] = "PR"
    iter_id: int
    pragma: str

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "pragma")
        st.iter_index(self.iter_id)
        key, _, value = self.pragma.partition("$")
        if key != "auto_unroll_max_step" or not value.isdigit():
            raise ScheduleError(f"unknown pragma {self.pragma!r}; supported: 'auto_unroll_max_step$<int>'")
        return _replace(state.stages, self.stage_id, st.with_(auto_unroll_max_step=int(value)))

    def to_python(self, state: State) -> str:
        return call_line("pragma", *_names(state, self.stage_id, self.iter_id), self.pragma)


@register_step
@dataclass(frozen=True)
class StorageAlignStep(Step):
    code: ClassVar[str] = "SA"
    iter_id: int
    factor: int
    offset: int

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "storage_align")
        it = st.iters[st.iter_index(self.iter_id)]
        spatial = st.root_names[: st.tensor.ndim]
        if it.name not in spatial:
            raise ScheduleError(f"storage_align on {st.name}: {it.name} is not an untransformed spatial axis")
        if state.dag.is_output(st.name):
            raise ScheduleError(f"storage_align on {st.name}: an output's layout is fixed by the caller")
        if self.factor <= 0 or not 0 <= self.offset < self.factor:
            raise ScheduleError(f"storage_align on {st.name}: need factor > 0 and 0 <= offset < factor")
        dim = spatial.index(it.name)
        aligned = tuple(a for a in st.storage_align if a[0] != dim) + ((dim, self.factor, self.offset),)
        return _replace(state.stages, self.stage_id, st.with_(storage_align=aligned))

    def to_python(self, state: State) -> str:
        return call_line("storage_align", *_names(state, self.stage_id, self.iter_id), self.factor, self.offset)


# ---------------------------------------------------------------------------------------------
# compute locations


@register_step
@dataclass(frozen=True)
class ComputeAtStep(Step):
    code: ClassVar[str] = "CA"
    target_stage_id: int
    target_iter_id: int

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "compute_at")
        target = compute_stage(state, self.target_stage_id, "compute_at target")
        it = target.iters[target.iter_index(self.target_iter_id)]
        if state.dag.is_output(st.name):
            raise ScheduleError(f"compute_at: {st.name} is an output; its buffer must be written whole")
        readers = state.effective_consumers(st.name)
        if readers != [target.name]:
            raise ScheduleError(
                f"compute_at: {st.name} can only be computed at its sole consumer, but it is read by "
                f"{', '.join(readers) or 'nobody'} (not just {target.name}); location {target.name}.{it.name}"
            )
        return _replace(state.stages, self.stage_id, st.with_(location="at", attach=(target.name, it.name)))

    def to_python(self, state: State) -> str:
        return call_line("compute_at", state.stages[self.stage_id].name,
                     *_names(state, self.target_stage_id, self.target_iter_id))


def _attached_to(stages, name: str) -> list[str]:
    return [s.name for s in stages if s.attach and s.attach[0] == name]


@register_step
@dataclass(frozen=True)
class ComputeInlineStep(Step):
    code: ClassVar[str] = "CI"

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "compute_inline")
        if isinstance(st.tensor.body, Reduce):
            raise ScheduleError(f"compute_inline: {st.name} is a reduction and cannot be inlined")
        if state.dag.is_output(st.name):
            raise ScheduleError(f"compute_inline: {st.name} is an output and must be stored")
        if attached := _attached_to(state.stages, st.name):
            raise ScheduleError(f"compute_inline: stages {attached} are computed at {st.name}")
        return _replace(state.stages, self.stage_id, st.with_(location="inline", attach=None))

    def to_python(self, state: State) -> str:
        return call_line("compute_inline", state.stages[self.stage_id].name)


@register_step
@dataclass(frozen=True)
class ComputeRootStep(Step):
    code: ClassVar[str] = "CR"

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = stage_at(state, self.stage_id)
        if st.is_placeholder:
            raise ScheduleError(f"compute_root: {st.name} is an input placeholder")
        return _replace(state.stages, self.stage_id, st.with_(location="root", attach=None))

    def to_python(self, state: State) -> str:
        return call_line("compute_root", state.stages[self.stage_id].name)


# ---------------------------------------------------------------------------------------------
# steps that add stages


def unique_stage_name(state: State, base: str) -> str:
    """`base`, or `base` with the first number that makes it a name no stage of `state` has."""
    taken = {s.name for s in state.stages}
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}{n}"
    return name


def _fresh_axes(t: Tensor) -> tuple[Var, ...]:
    return tuple(Var(a.name, a.dtype, a.extent) for a in t.axes)


def with_body(t: Tensor, axes: tuple[Var, ...], body) -> Tensor:
    """`t` computing `body` over `axes`."""
    return Tensor(t.shape, body.dtype, t.name, axes, body, t.tag, t.attrs)


@by_identity(4096)
def _cache_write_tensors(t: Tensor, name: str, scope: str) -> tuple[Tensor, Tensor]:
    """The cache tensor `name` computing `t`'s body, and `t` rewritten as a copy of it. Memoized per
    (tensor, name) so that replaying a state rebuilds no tensors (and their stages are memoized too)."""
    cache_axes = _fresh_axes(t)
    cache_body = substitute(t.body, dict(zip(t.axes, cache_axes)))
    cache = Tensor(t.shape, t.dtype, name, cache_axes, cache_body, t.tag, dict(t.attrs) | {"scope": scope})
    axes = _fresh_axes(t)
    return cache, with_body(t, axes, Load(cache, axes, t.dtype))


@register_step
@dataclass(frozen=True)
class CacheWriteStep(Step):
    """Compute into a new stage `<name>_<scope>`; the original stage becomes a copy of it."""

    code: ClassVar[str] = "CHW"
    new_stage_offset: ClassVar[int | None] = 0
    scope: str

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "cache_write")
        if st.relations or st.iters != make_stage(st.tensor).iters:
            raise ScheduleError(f"cache_write on {st.name}: apply it before transforming the stage's loops")
        t = st.tensor
        name = unique_stage_name(state, f"{t.name}_{self.scope}")
        cache, copy = _cache_write_tensors(t, name, self.scope)
        new_copy = make_stage(copy).with_(location=st.location, attach=st.attach)
        stages = state.stages[: self.stage_id] + (make_stage(cache), new_copy) + state.stages[self.stage_id + 1:]
        # producers computed inside the stage are now read by the cache stage, whose loops have the same names
        return tuple(s.with_(attach=(name, s.attach[1])) if s.attach and s.attach[0] == t.name else s for s in stages)

    def to_python(self, state: State) -> str:
        return call_line("cache_write", state.stages[self.stage_id].name, self.scope)


@register_step
@dataclass(frozen=True)
class CacheReadStep(Step):
    """Copy tensor `stage` into `<name>_<scope>`, read by `reader_stage_ids` instead of the original."""

    code: ClassVar[str] = "CHR"
    new_stage_offset: ClassVar[int | None] = 1
    scope: str
    reader_stage_ids: tuple[int, ...]

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = stage_at(state, self.stage_id)
        if st.location == "inline":
            raise ScheduleError(f"cache_read: {st.name} is inlined")
        readers = [compute_stage(state, r, "cache_read reader") for r in self.reader_stage_ids]
        if not readers:
            raise ScheduleError(f"cache_read of {st.name}: name at least one reader stage")
        t = st.tensor
        name = unique_stage_name(state, f"{t.name}_{self.scope}")
        axes = tuple(Var(f"ax{d}", "int32", e) for d, e in enumerate(t.shape))
        cache = Tensor(t.shape, t.dtype, name, axes, Load(t, axes, t.dtype), "injective", {"scope": self.scope})
        stages = list(state.stages)
        for rid, reader in zip(self.reader_stage_ids, readers):
            if st.name not in state.direct_producers(reader.name):
                raise ScheduleError(f"cache_read of {st.name}: stage {reader.name} does not read it")
            body = transform(
                reader.tensor.body,
                lambda n: Load(cache, n.indices, n.dtype) if isinstance(n, Load) and n.tensor.name == t.name else None,
            )
            stages[rid] = reader.with_(tensor=with_body(reader.tensor, reader.tensor.axes, body), body_text=str(body))
        stages.insert(self.stage_id + 1, make_stage(cache))
        return tuple(stages)

    def to_python(self, state: State) -> str:
        readers = [state.stages[r].name for r in self.reader_stage_ids]
        return call_line("cache_read", state.stages[self.stage_id].name, self.scope, readers)


@register_step
@dataclass(frozen=True)
class RfactorStep(Step):
    """Factor reduce iterator `iter_id` out into a new stage `<name>_rf` where it is a spatial axis."""

    code: ClassVar[str] = "RF"
    new_stage_offset: ClassVar[int | None] = 0
    iter_id: int
    factor_iter_id: int

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = compute_stage(state, self.stage_id, "rfactor")
        t = st.tensor
        body = t.body
        if not isinstance(body, Reduce):
            raise ScheduleError(f"rfactor: {st.name} is not a reduction")
        it = st.iters[st.iter_index(self.iter_id)]
        if it.kind != "reduce":
            raise ScheduleError(f"rfactor: {st.name}.{it.name} is not a reduce iterator")
        if not 0 <= self.factor_iter_id <= t.ndim:
            raise ScheduleError(f"rfactor: factor_iter_id must be in 0..{t.ndim}")
        leaves = [i for i in st.iters if i.kind == "reduce"]
        if any(i.extent is None for i in leaves):
            raise ScheduleError(f"rfactor on {st.name}: split lengths must be filled first")
        rf_axes = list(_fresh_axes(t))
        rf_axes.insert(self.factor_iter_id, Var(it.name, "int32", it.extent))
        leaf_vars = {i.name: Var(i.name, "int32", i.extent, reduce=True) for i in leaves}
        leaf_vars[it.name] = rf_axes[self.factor_iter_id]
        reduce_roots = st.root_names[t.ndim:]
        spatial_leaves = {i.name: Var(i.name, "int32", i.extent) for i in st.iters if i.kind != "reduce"}
        roots = {n: ax.extent for n, ax in zip(st.root_names, t.axes + body.axes)}
        d = derive(st, roots, leaf_vars | spatial_leaves)
        mapping = dict(zip(t.axes, [a for n, a in enumerate(rf_axes) if n != self.factor_iter_id]))
        mapping.update(zip(body.axes, (d.values[n] for n in reduce_roots)))
        guards = [d.values[n] < ax.extent for n, ax in zip(reduce_roots, body.axes) if d.covered[n] > ax.extent]
        cond = body.condition
        conds = ([substitute(cond, mapping)] if cond is not None else []) + guards
        rf_reduce = tuple(v for n, v in leaf_vars.items() if n != it.name)
        if not rf_reduce:
            raise ScheduleError(f"rfactor on {st.name}: leave at least one reduce iterator in the rf stage")
        rf_body = Reduce(body.combiner, substitute(body.source, mapping), rf_reduce,
                         all_of(*conds) if conds else None, None, body.dtype)
        name = unique_stage_name(state, f"{t.name}_rf")
        shape = tuple(a.extent for a in rf_axes)
        rf = Tensor(shape, t.dtype, name, tuple(rf_axes), rf_body, t.tag, dict(t.attrs))
        axes = _fresh_axes(t)
        r = Var(it.name, "int32", it.extent, reduce=True)
        idx = list(axes)
        idx.insert(self.factor_iter_id, r)
        final_body = Reduce(body.combiner, Load(rf, tuple(idx), t.dtype), (r,), None, body.init, t.dtype)
        final = with_body(t, axes, final_body)
        new_final = make_stage(final).with_(location=st.location, attach=st.attach)
        if _attached_to(state.stages, st.name):
            raise ScheduleError(f"rfactor on {st.name}: stages are computed at it; rfactor first")
        return state.stages[: self.stage_id] + (make_stage(rf), new_final) + state.stages[self.stage_id + 1:]

    def to_python(self, state: State) -> str:
        return call_line("rfactor", *_names(state, self.stage_id, self.iter_id), self.factor_iter_id)

