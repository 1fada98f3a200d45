"""A DAG whose tensors are laid out (ALT §4, §6): `lay_out` rewrites a DAG so that the tensors it names are stored in
their layouts (schedule.layout), and `TransformLayoutStep` (`s.transform_layout(name, primitives)`) does it as the
first steps of a State, so a record replays it from the task's own DAG.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from tensorgen.dag import ComputeDAG
from tensorgen.errors import ScheduleError
from tensorgen.loopir.simplify import linear, simplify
from tensorgen.memo import by_identity
from tensorgen.schedule.layout import Layout, LayoutPrimitive, Part, guest_fits
from tensorgen.schedule.stage import Stage, make_stage
from tensorgen.schedule.steps import Step, register_step, stage_at
from tensorgen.te.expr import Expr, Load, Var, min_expr, substitute, transform
from tensorgen.te.tensor import Tensor

if TYPE_CHECKING:
    from tensorgen.schedule.state import State


def lay_out(dag: ComputeDAG, layouts: Mapping[str, Sequence[LayoutPrimitive]]) -> ComputeDAG:
    """`dag` with each tensor named in `layouts` stored in its layout (ALT §4, §6): an input or output then takes
    that shape as an argument, a computed tensor is computed over the new layout's index space (its body reads
    the element each place holds, source_index; a place past the end computes the last element again), and
    every read of it goes through `Layout.index`. A read of an unfolded dimension at `a * V + r` (a reader's
    output axis `a`, a window `r` of reduce axes: a convolution's input row) takes the tile `a // (stride / V)`,
    which must hold the whole window."""
    plans = {name: Layout.of(dag.by_name[name].shape, prims) for name, prims in layouts.items() if name in dag.by_name}
    unknown = sorted(set(layouts) - set(plans))
    if unknown:
        raise ScheduleError(f"lay_out: no tensor {unknown} in the DAG (its tensors: {sorted(dag.by_name)})")
    hosts = _hosts(dag, plans)
    new_of: dict[int, Tensor] = {}

    def reads_in(reader: Tensor):
        def read(n: Expr) -> Expr | None:
            if not isinstance(n, Load):
                return None
            if n.tensor.name in hosts:  # a guest: read where its host stores it
                host, d = hosts[n.tensor.name]
                layout = plans[host.name]
                return Load(new_of[id(host)], layout.index(layout.guest_index(d, n.tensor.shape, n.indices)), n.dtype)
            new = new_of[id(n.tensor)]
            layout = plans.get(n.tensor.name)
            if layout is not None:
                return Load(new, layout.index(n.indices, _tiles(layout, n, reader)), n.dtype)
            return Load(new, n.indices, n.dtype) if new is not n.tensor else None
        return read

    for t in dag.inputs:  # first: a guest's reader reads its host
        new_of[id(t)] = _laid_out(t, None, plans[t.name], [p.to_json() for p in layouts[t.name]]) \
            if t.name in plans else t
    order = []
    for t in dag.tensors:
        if t.name in hosts:
            continue
        body = transform(t.body, reads_in(t)) if t.body is not None else None
        layout = plans.get(t.name)
        if t.is_placeholder:
            new = new_of[id(t)]
        elif layout is not None:
            new = _laid_out(t, body, layout, [p.to_json() for p in layouts[t.name]])
        elif body is t.body:
            new = t
        else:
            new = Tensor(t.shape, t.dtype, t.name, t.axes, body, t.tag, t.attrs)
        if new is not t and new.body is not None:  # the digit arithmetic of a layout, over the axes' extents
            new = Tensor(new.shape, new.dtype, new.name, new.axes, simplify(new.body), new.tag, new.attrs)
        new_of[id(t)] = new
        order.append(new)
    return ComputeDAG.from_parts(order, [new_of[id(t)] for t in dag.inputs if t.name not in hosts],
                                 [new_of[id(t)] for t in dag.outputs])


def _hosts(dag: ComputeDAG, plans: Mapping[str, Layout]) -> dict[str, tuple[Tensor, int]]:
    """Each guest stored in another tensor (store_at): its host and the host's dimension that holds it."""
    out: dict[str, tuple[Tensor, int]] = {}
    for name, layout in plans.items():
        for d, guest in layout.guests:
            host, g = dag.by_name[name], dag.by_name.get(guest)
            if g is None or g.name in plans or g.name in out or g in dag.outputs \
                    or not (host.is_placeholder and g.is_placeholder and host.attrs.get("constant")
                            and g.attrs.get("constant")) or g.dtype != host.dtype \
                    or not guest_fits(host.shape, d, g.shape):
                raise ScheduleError(f"lay_out: {name} stores {guest!r} at dimension {d}: both must be constant "
                                    f"inputs of one dtype, the guest in no other layout and of the host's shape "
                                    f"without that dimension ({list(host.shape)} at {d}; the guest's: "
                                    f"{list(g.shape) if g is not None else 'no such tensor'})")
            out[guest] = (host, d)
    return out


@dataclass(frozen=True)
class SlidingRead:
    """An index `axis * stride + window`: one output axis of the reader times a stride, plus reduce axes and a
    constant that together span `window` elements (how a convolution reads its input rows)."""

    axis: Var
    stride: int
    window: int

    def span(self, per_tile: int) -> int:
        """The elements a tile of `per_tile` consecutive values of `axis` reads."""
        return self.stride * (per_tile - 1) + self.window


def sliding_read(index: Expr, axes: Sequence[Var]) -> SlidingRead | None:
    """`index` as a SlidingRead over the reader's output `axes`, or None when it is no such read."""
    terms, offset = linear(index)
    spatial = [(v, c) for v, c in terms.items() if any(v is a for a in axes)]
    window = [(v, c) for v, c in terms.items() if not any(v is a for a in axes)]
    if len(spatial) != 1 or spatial[0][1] <= 0 or offset < 0 \
            or any(not isinstance(v, Var) or not v.extent or c < 0 for v, c in window):
        return None
    (axis, stride), = spatial
    return SlidingRead(axis, stride, offset + sum(c * (v.extent - 1) for v, c in window) + 1)


def _tiles(layout: Layout, load: Load, reader: Tensor) -> dict[int, Expr] | None:
    """The tile of each unfolded dimension that `reader`'s `load` reads (see lay_out)."""
    if not layout.overlaps:
        return None
    tiles = {}
    for d in range(len(layout.shape)):
        tile = next((p for parts in layout.dims for p in parts if p.dim == d and p.window), None)
        if tile is None:
            continue
        read = sliding_read(load.indices[d], reader.axes)
        if read is None or tile.place % read.stride:
            raise ScheduleError(f"{reader.name} reads unfolded dimension {d} of {load.tensor.name} at "
                                f"{load.indices[d]}: not an output axis times a stride plus a window")
        per_tile = tile.place // read.stride
        if read.span(per_tile) > tile.window:
            raise ScheduleError(f"{reader.name} reads {read.span(per_tile)} elements of dimension {d} of "
                                f"{load.tensor.name} per tile of {per_tile} outputs; the unfold's tiles hold "
                                f"{tile.window}")
        tiles[d] = read.axis // per_tile if per_tile > 1 else read.axis
    return tiles


def _laid_out(t: Tensor, body: Expr | None, layout: Layout, records: list) -> Tensor:
    attrs = {**t.attrs, "layout": records}
    if t.is_placeholder:
        return Tensor(layout.new_shape, t.dtype, t.name, attrs=attrs)
    axes = tuple(Var(_axis_name(t, parts, g), "int32", n) for g, (parts, n) in enumerate(zip(layout.dims,
                                                                                             layout.new_shape)))
    source = [e if layout.reach(d) <= n else min_expr(e, n - 1)  # past the end: the last element again
              for d, (e, n) in enumerate(zip(layout.source_index(axes), t.shape))]
    return Tensor(layout.new_shape, t.dtype, t.name, axes, substitute(body, dict(zip(t.axes, source))), t.tag, attrs)


def _axis_name(t: Tensor, parts: tuple[Part, ...], g: int) -> str:
    """A new dimension's loop name from the axes it holds: `i` whole, `i4` its digit from place 4, `i_j` fused."""
    if not parts:
        return f"ax{g}"
    return "_".join(t.axes[p.dim].name + ("" if p.place == 1 and p.extent == t.shape[p.dim] else f"{p.place}")
                    for p in parts)


def _frozen(value):
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


@by_identity(64)
def _step_dag(dag: ComputeDAG, primitives: str, name: str) -> ComputeDAG:
    """The DAG after a layout step of `name` (`primitives` as JSON: keyed by value, so every state that lays a DAG
    out alike shares it; State.apply asks for it and for its stages)."""
    return lay_out(dag, {name: [LayoutPrimitive.from_json(r) for r in json.loads(primitives)]})


@register_step
@dataclass(frozen=True)
class TransformLayoutStep(Step):
    """Store tensor `stage_id` in the layout its `primitives` (JSON records) make: the state's DAG becomes
    `lay_out(dag, ...)` and every stage starts afresh. Layout steps come before any loop step (ALT's joint
    stage picks a layout, then tunes loops over the nest it makes)."""

    code: ClassVar[str] = "TL"
    primitives: tuple

    def __post_init__(self) -> None:
        object.__setattr__(self, "primitives", _frozen(self.primitives))

    def layout_primitives(self) -> list[LayoutPrimitive]:
        return [LayoutPrimitive.from_json(r) for r in self.primitives]

    def new_dag(self, state: State) -> ComputeDAG:
        if any(not isinstance(s, TransformLayoutStep) for s in state.steps):
            raise ScheduleError("transform_layout: layouts are set before any loop step")
        return _step_dag(state.dag, json.dumps(self.primitives), stage_at(state, self.stage_id).name)

    def apply(self, state: State) -> tuple[Stage, ...]:
        return tuple(make_stage(t) for t in self.new_dag(state).tensors)

    def to_python(self, state: State) -> str:
        prims = ", ".join(p.to_python() for p in self.layout_primitives())
        return f"s.transform_layout({state.stages[self.stage_id].name!r}, [{prims}])"
