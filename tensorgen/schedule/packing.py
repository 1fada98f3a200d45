"""Tile layouts: a tensor laid out in the order its tiled reader walks it, packed at build or at run time.

A conv or matmul schedule splits each axis of an operand into tile levels and interleaves them with
the other axes' levels; read in its original layout, the innermost loops then jump through memory.
The tile layout gives the operand one dimension per tile level, in the order the reader's loops
nest — e.g. GMM's B (k, n) under an SSRSRS tiling becomes [j0, j1, k0, j2, k1, j3], so each
k-block of a column panel is one contiguous run, the layout a BLAS packs its operands into.

A constant is repacked once at build time (schedule/layout_rewrite.py, Ansor §4.2). Any other input
is repacked on every call by a stage of the program (`PackLayoutStep`, a layout-changing cache_read,
offered as a sketch by rules.PackOperand): a copy that costs one pass over the operand and can be
computed at the root (once, in parallel) or inside the reader's tiles (a panel at a time, in cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from tensorgen.errors import ScheduleError
from tensorgen.schedule.layout import Layout, Part
from tensorgen.schedule.relations import split_radices
from tensorgen.schedule.stage import Fuse, Split, Stage, make_stage
from tensorgen.schedule.steps import (
    Step,
    call_line,
    compute_stage,
    register_step,
    stage_at,
    unique_stage_name,
    with_body,
)
from tensorgen.te.expr import Expr, Load, Var, transform, walk
from tensorgen.te.tensor import Tensor

if TYPE_CHECKING:
    from tensorgen.schedule.state import State


@dataclass(frozen=True)
class LayoutRewrite:
    """How tensor `name` is repacked: a `Layout` (schedule.layout) whose new dimensions are one tile level each,
    outer to inner, `parts[k]` = (original dim, place value, extent) of level k; `loop_names`: the reader's loop
    of each level."""

    name: str
    layout: Layout
    loop_names: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, name: str, shape: tuple[int, ...], parts: tuple[tuple[int, int, int], ...],
           loop_names: tuple[str, ...] = ()) -> LayoutRewrite:
        return cls(name, Layout(tuple(shape), tuple((Part(d, p, e),) for d, p, e in parts)), loop_names)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    @property
    def parts(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((p.dim, p.place, p.extent) for (p,) in self.layout.dims)

    @property
    def new_shape(self) -> tuple[int, ...]:
        return self.layout.new_shape

    def index(self, indices: tuple[Expr, ...]) -> tuple[Expr, ...]:
        """Indices into the new layout of the element at original `indices`."""
        return self.layout.index(indices)

    def source_index(self, axes: tuple[Var, ...]) -> tuple[Expr, ...]:
        """Indices into the original layout of the element at new-layout `axes`."""
        return self.layout.source_index(axes)

    def pack(self, array: np.ndarray) -> np.ndarray:
        """`array` (original layout) in the new layout."""
        return self.layout.pack(array)


def tile_layout(stage: Stage, t: Tensor, every_level: bool = False) -> LayoutRewrite | None:
    """The layout of `t` in the order `stage`'s loops walk it; None when `stage` does not read it
    once with each index a distinct plain loop axis, when a split is not perfect or an axis is fused,
    or (unless `every_level`) when the tile order is `t`'s own. Levels of extent 1 get no dimension
    unless `every_level`: a packing stage keeps one loop per level, so that its later steps still
    find their loops when a tile-size mutation moves a level to 1 or away from it."""
    roots = _plain_read(stage, t)
    if roots is None:
        return None
    extents = _root_extents(stage)
    levels = _tile_levels(stage, {r: extents[r] for r in roots})
    if levels is None:
        return None
    position = {it.name: k for k, it in enumerate(stage.iters)}
    parts = sorted((position[leaf], dim, place, extent, leaf)
                   for dim, root in enumerate(roots) for leaf, (r, place, extent) in levels.items()
                   if r == root and (extent > 1 or every_level))
    plan = LayoutRewrite.of(t.name, t.shape, tuple((d, p, e) for _, d, p, e, _ in parts), tuple(p[-1] for p in parts))
    identity = tuple((d, 1, n) for d, n in enumerate(t.shape) if n > 1)
    return None if plan.parts == identity and not every_level else plan


def _plain_read(stage: Stage, t: Tensor) -> list[str] | None:
    """The root axes `stage` reads `t` at, when it reads it once, each index a distinct root axis that
    spans its dimension exactly. A loop longer than the dimension reads it under a guard (the first
    part of a Concat: `select(i < 1, cls[i], ...)`) and a shorter one only a slice of it: a layout
    built from such a loop's tiles would not hold the tensor's elements."""
    loads = [n for n in walk(stage.tensor.body) if isinstance(n, Load) and n.tensor.name == t.name]
    root_of = {id(v): r for v, r in zip(stage.tensor.axes + stage.tensor.reduce_axes, stage.root_names)}
    if len(loads) != 1 or not all(isinstance(i, Var) and id(i) in root_of for i in loads[0].indices):
        return None
    roots = [root_of[id(i)] for i in loads[0].indices]
    extents = _root_extents(stage)
    if len(set(roots)) != len(roots) or any(extents[r] != n for r, n in zip(roots, t.shape)):
        return None
    return roots


def _root_extents(stage: Stage) -> dict[str, int]:
    return dict(zip(stage.root_names, list(stage.tensor.shape) + [a.extent for a in stage.tensor.reduce_axes]))


def _tile_levels(stage: Stage, extents: dict[str, int], partial: bool = False) \
        -> dict[str, tuple[str, int | None, int | None]] | None:
    """Leaf iterator -> (root axis, place value, extent) for the leaves of `extents`' root axes, from
    the stage's splits at full extent; None when one is fused, or split imperfectly or unfilled (with
    `partial`, such a split's leaves get place and extent None instead)."""
    levels: dict[str, tuple[str, int | None, int | None]] = {root: (root, 1, e) for root, e in extents.items()}
    for rel in stage.relations:
        if isinstance(rel, Fuse):
            if any(p in levels for p in rel.parents):
                return None
            continue
        if not isinstance(rel, Split) or rel.parent not in levels:
            continue
        root, place, extent = levels.pop(rel.parent)
        radices = split_radices(extent, rel.lengths, rel.inner_to_outer)
        if place is None or None in radices or math.prod(radices) != extent:
            if not partial:
                return None
            levels.update((child, (root, None, None)) for child in rel.children)
            continue
        inner = place
        for child, radix in zip(reversed(rel.children), reversed(radices)):
            levels[child] = (root, inner, radix)
            inner *= radix
    return levels


def interleaves(stage: Stage, t: Tensor) -> bool:
    """`stage` reads `t` at plain loop axes whose tile levels (split lengths may be unfilled) nest in
    an order other than `t`'s dimension order, with a level of `t`'s last dimension innermost: a tile
    layout of `t` differs from its own and still reads contiguous runs in the innermost loop."""
    roots = _plain_read(stage, t)
    if roots is None:
        return False
    extents = _root_extents(stage)
    levels = _tile_levels(stage, {r: extents[r] for d, r in enumerate(roots) if t.shape[d] > 1}, partial=True)
    if levels is None:
        return False
    dim_of = {r: d for d, r in enumerate(roots)}
    dims = [dim_of[levels[it.name][0]] for it in stage.iters if it.name in levels and it.extent != 1]
    return bool(dims) and dims != sorted(dims) and dims[-1] == t.ndim - 1


_PACKED: dict[tuple, tuple[Tensor, Tensor, Tensor, Tensor]] = {}


def _packed_tensors(t: Tensor, reader: Tensor, layout: LayoutRewrite, name: str) -> tuple[Tensor, Tensor]:
    """The packed copy `name` of `t` in `layout`, and `reader` rewritten to read it. Memoized (by the
    tensors' identity): replaying a state then rebuilds no tensors, and their stages are memoized too."""
    key = (id(t), id(reader), layout.parts, layout.loop_names, name)
    hit = _PACKED.get(key)
    if hit is not None and hit[0] is t and hit[1] is reader:
        return hit[2], hit[3]
    names = layout.loop_names or [f"ax{d}" for d in range(len(layout.parts))]
    axes = tuple(Var(n, "int32", e) for n, (_, _, e) in zip(names, layout.parts))
    packed = Tensor(layout.new_shape, t.dtype, name, axes, Load(t, layout.source_index(axes), t.dtype), "injective")
    body = transform(reader.body, lambda n: Load(packed, layout.index(n.indices), n.dtype)
                     if isinstance(n, Load) and n.tensor.name == t.name else None)
    new_reader = with_body(reader, reader.axes, body)
    if len(_PACKED) > 4096:
        _PACKED.clear()
    _PACKED[key] = (t, reader, packed, new_reader)
    return packed, new_reader


@register_step
@dataclass(frozen=True)
class PackLayoutStep(Step):
    """Copy tensor `stage` into `<name>_packed`, laid out in the tile order of stage `reader_stage_id`
    (its only reader, which then reads the copy). The layout follows the reader's split lengths at the
    time of replay, so tile-size mutations move it along; with lengths unfilled (a sketch), or when the
    tiling admits none, the copy keeps the original layout."""

    code: ClassVar[str] = "PK"
    new_stage_offset: ClassVar[int | None] = 1
    reader_stage_id: int

    def apply(self, state: State) -> tuple[Stage, ...]:
        st = stage_at(state, self.stage_id)
        if st.location == "inline":
            raise ScheduleError(f"pack_layout: {st.name} is inlined")
        reader = compute_stage(state, self.reader_stage_id, "pack_layout reader")
        if state.consumers(st.name) != [reader.name]:
            raise ScheduleError(f"pack_layout of {st.name}: {reader.name} must be its only reader")
        t = st.tensor
        layout = tile_layout(reader, t, every_level=True) \
            or LayoutRewrite.of(t.name, t.shape, tuple((d, 1, n) for d, n in enumerate(t.shape)))  # its own
        packed, new_reader = _packed_tensors(t, reader.tensor, layout, unique_stage_name(state, f"{t.name}_packed"))
        stages = list(state.stages)
        stages[self.reader_stage_id] = reader.with_(tensor=new_reader, body_text=str(new_reader.body))
        stages.insert(self.stage_id + 1, make_stage(packed))
        return tuple(stages)

    def to_python(self, state: State) -> str:
        return call_line("pack_layout", state.stages[self.stage_id].name, state.stages[self.reader_stage_id].name)
