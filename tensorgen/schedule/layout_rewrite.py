"""Weight layout rewrite (Ansor §4.2): a constant input is repacked so the tiled loops walk it in order.

A conv or dense schedule splits each axis of the weight into tile levels and interleaves them with
the other axes' levels; read in its original layout, the innermost loops then jump through memory.
Since a constant (`placeholder(..., constant=True)`) can be repacked once at build time, the rewrite
gives it one dimension per tile level, in the order the loops of its reading stage nest — e.g. OIHW
weights under an SSRSRS tiling become [co0, co1, ci0, kh, kw, co2, ci1, co3]. Ansor reports ~40% on
ResNet-50 from this alone.

The rewrite applies when the constant is read once, by one stage that is not inlined, with each index
a plain loop axis, and every split of those axes is perfect (what the search samples). The rewritten
State is the same steps replayed on a DAG whose placeholder has the new shape and whose read indexes it
by `(axis // place) % extent`, which lowering simplifies back to the tile loop variables. Candidates
are measured rewritten (measure/builder.py) and models built rewritten (graph/build.py); the cost
model's features stay those of the original state, as in TVM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensorgen.dag import rebuild_loads
from tensorgen.schedule.stage import Fuse, Split, Stage
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import split_radices
from tensorgen.te.expr import Expr, Load, Var, walk
from tensorgen.te.tensor import Tensor


@dataclass(frozen=True)
class LayoutRewrite:
    """How constant `name` of `shape` is repacked: new dimensions outer to inner, each a tile level
    (original dim, place value, extent) of one original dimension."""

    name: str
    shape: tuple[int, ...]
    parts: tuple[tuple[int, int, int], ...]

    @property
    def new_shape(self) -> tuple[int, ...]:
        return tuple(extent for _, _, extent in self.parts)

    def index(self, indices: tuple[Expr, ...]) -> tuple[Expr, ...]:
        """Indices into the new layout of the element at original `indices`."""
        out = []
        for dim, place, extent in self.parts:
            e = indices[dim] // place if place != 1 else indices[dim]
            out.append(e % extent if place * extent != self.shape[dim] else e)
        return tuple(out)

    def pack(self, array: np.ndarray) -> np.ndarray:
        """`array` (original layout) in the new layout."""
        if tuple(array.shape) != self.shape:
            raise ValueError(f"layout rewrite of {self.name}: expected shape {list(self.shape)}, "
                             f"got {list(array.shape)}")
        levels = sorted(self.parts, key=lambda p: (p[0], -p[1]))  # per dim, outer to inner
        where = {p: k for k, p in enumerate(levels)}
        split = array.reshape([extent for _, _, extent in levels])
        return np.ascontiguousarray(split.transpose([where[p] for p in self.parts]))


def plan_layout_rewrites(state: State) -> list[LayoutRewrite]:
    """The rewrites `state` admits, one per constant input it can repack (see the module docstring)."""
    out = []
    for t in state.dag.inputs:
        if t.attrs.get("constant"):
            plan = _plan(state, t)
            if plan is not None:
                out.append(plan)
    return out


def rewrite_layout(state: State) -> tuple[State, list[LayoutRewrite]]:
    """`state` on a DAG whose constants are repacked (itself and [] when none can be); the caller packs
    the constants' data with `LayoutRewrite.pack`."""
    plans = plan_layout_rewrites(state)
    if not plans:
        return state, []
    dag = state.dag
    by_name = {p.name: p for p in plans}
    new_inputs = {
        p.name: Tensor(p.new_shape, dag.by_name[p.name].dtype, p.name) for p in plans
    }  # no longer `constant`: a rewritten DAG is not rewritten again

    def load(n: Load) -> Load:  # called for reads of the replaced placeholders only
        return Load(new_inputs[n.tensor.name], by_name[n.tensor.name].index(n.indices), n.dtype)

    new_dag = rebuild_loads(dag, new_inputs, load)
    return State.replay(new_dag, state.steps), plans


def _plan(state: State, t: Tensor) -> LayoutRewrite | None:
    readers = [s for s in state.stages if not s.is_placeholder and _reads(s.tensor, t.name)]
    if len(readers) != 1 or readers[0].location == "inline":
        return None
    stage = readers[0]
    loads = [n for n in walk(stage.tensor.body) if isinstance(n, Load) and n.tensor.name == t.name]
    root_of = {id(v): r for v, r in zip(stage.tensor.axes + stage.tensor.reduce_axes, stage.root_names)}
    if len(loads) != 1 or not all(isinstance(i, Var) and id(i) in root_of for i in loads[0].indices):
        return None
    roots = [root_of[id(i)] for i in loads[0].indices]
    if len(set(roots)) != len(roots):
        return None
    extents = dict(zip(stage.root_names, list(stage.tensor.shape) + [a.extent for a in stage.tensor.reduce_axes]))
    levels = _tile_levels(stage, {r: extents[r] for r in roots})
    if levels is None:
        return None
    position = {it.name: k for k, it in enumerate(stage.iters)}
    parts = sorted((position[leaf], dim, place, extent)
                   for dim, root in enumerate(roots) for leaf, (r, place, extent) in levels.items()
                   if r == root and extent > 1)
    plan = LayoutRewrite(t.name, t.shape, tuple((d, p, e) for _, d, p, e in parts))
    identity = tuple((d, 1, n) for d, n in enumerate(t.shape) if n > 1)
    return None if plan.parts == identity else plan


def _tile_levels(stage: Stage, extents: dict[str, int]) -> dict[str, tuple[str, int, int]] | None:
    """Leaf iterator -> (root axis, place value, extent) for the leaves of `extents`' root axes, from
    the stage's splits at full extent; None when one is fused or split imperfectly."""
    levels = {root: (root, 1, extent) for root, extent in extents.items()}
    for rel in stage.relations:
        if isinstance(rel, Fuse):
            if any(p in levels for p in rel.parents):
                return None
            continue
        if not isinstance(rel, Split) or rel.parent not in levels:
            continue
        root, place, extent = levels.pop(rel.parent)
        radices = split_radices(extent, rel.lengths, rel.inner_to_outer)
        if None in radices or math.prod(radices) != extent:
            return None
        inner = place
        for child, radix in zip(reversed(rel.children), reversed(radices)):
            levels[child] = (root, inner, radix)
            inner *= radix
    return levels


def _reads(t: Tensor, name: str) -> bool:
    return t.body is not None and any(isinstance(n, Load) and n.tensor.name == name for n in walk(t.body))

