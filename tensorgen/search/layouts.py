"""Layout templates (ALT §5.1): which layouts the search may give a task's tensors, as tile parameters.

ALT tiles the layout of every tensor a complex operator (conv, GEMM) touches, with the tiled dimensions last:
a GEMM's C becomes (M/mt, N/nt, mt, nt), A (M/mt, K/kt, mt, kt), B (K/kt, N/nt, kt, nt) — one tile size per loop
axis, shared by every tensor that axis indexes. `TilingTemplate` is that template for any stage with data reuse
(GEMM, dense, batch matmul, convolution's output and weight): a tensor dimension indexed by a plain loop axis is
split by that axis' tile; a dimension indexed by an expression (a convolution's input row `h * stride + rh`)
stays whole (overlapped tiling with unfold is the convolution template still to come). The layout of the
stage's output is propagated along the element-wise stages after it (ALT §4.2: same shape, element-wise).

A template is a registered rule (`LAYOUT_TEMPLATES`) with a condition (`space`: the tile parameters it offers
for a DAG, or None) and an application (`layouts`: the primitives of each tensor for chosen tiles).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.dag import ComputeDAG
from tensorgen.schedule.layout import LayoutPrimitive, Reorder, Split
from tensorgen.te.expr import Load, Var, walk
from tensorgen.te.tensor import Tensor

Layouts = dict[str, list[LayoutPrimitive]]


@dataclass(frozen=True)
class TileSpace:
    """The tile parameters of a template on one DAG: for each loop axis (by name), its extent's divisors."""

    anchor: str  # the stage whose loop axes the tiles belong to
    choices: Mapping[str, tuple[int, ...]]

    def sample(self, rng: np.random.Generator) -> dict[str, int]:
        return {axis: int(rng.choice(options)) for axis, options in self.choices.items()}

    @property
    def size(self) -> int:
        return int(np.prod([len(c) for c in self.choices.values()]))


def _divisors(n: int, smallest: int, largest: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0 and (d == 1 or smallest <= d <= largest))


@dataclass(frozen=True)
class TilingTemplate:
    """One-level layout tiling of the tensors a data-reuse stage reads and writes (ALT §5.1, GEMM and conv)."""

    name: str = "tiling"
    smallest: int = 4  # tile sizes considered: 1 (untiled) or smallest..largest
    largest: int = 64
    constants_only: bool = False  # lay out only constant inputs (weights): a model's activations keep theirs

    def space(self, dag: ComputeDAG) -> TileSpace | None:
        anchor = _anchor(dag)
        if anchor is None:
            return None
        axes = [a for a in (*anchor.axes, *anchor.reduce_axes) if a.extent and a.extent > 1]
        return TileSpace(anchor.name, {a.name: _divisors(a.extent, self.smallest, self.largest) for a in axes})

    def layouts(self, dag: ComputeDAG, tiles: Mapping[str, int]) -> Layouts:
        anchor = dag.by_name[self.space(dag).anchor]
        out: Layouts = {}
        for t, axes in _tensors_of(dag, anchor):
            if self.constants_only and not t.attrs.get("constant"):
                continue
            prims = tiled(t.shape, [tiles.get(a.name, 1) if a is not None else 1 for a in axes])
            if prims:
                out[t.name] = prims
        return out


def tiled(shape: Sequence[int], tiles: Sequence[int]) -> list[LayoutPrimitive]:
    """Split each dimension of `shape` by its tile (1: untouched) and move the tiles innermost, in order."""
    prims: list[LayoutPrimitive] = []
    outer, inner, dim = [], [], 0
    for n, t in zip(shape, tiles):
        if 1 < t < n and n % t == 0:
            prims.append(Split(dim, (n // t, t)))
            outer.append(dim)
            inner.append(dim + 1)
            dim += 2
        else:
            outer.append(dim)
            dim += 1
    if not inner:
        return []
    return [*prims, Reorder(tuple(outer + inner))]


def _anchor(dag: ComputeDAG) -> Tensor | None:
    """The last stage with data reuse that reads two tensors (the complex operator)."""
    found = None
    for t in dag.tensors:
        if not t.is_placeholder and t.reduce_axes and dag.has_data_reuse(t.name) and len(_reads(t)) >= 2:
            found = t
    return found


def _reads(t: Tensor) -> list[Load]:
    return [n for n in walk(t.body) if isinstance(n, Load)]


def _tensors_of(dag: ComputeDAG, anchor: Tensor) -> list[tuple[Tensor, list[Var | None]]]:
    """The tensors the template lays out, each with the anchor's loop axis indexing each of its dimensions
    (None where an index is no plain axis): the anchor's operands, itself, and the element-wise chain after it
    with every same-shaped tensor that chain reads."""
    out: dict[str, tuple[Tensor, list[Var | None]]] = {}
    for load in _reads(anchor):
        axes = [i if isinstance(i, Var) else None for i in load.indices]
        if load.tensor.name not in out and any(a is not None for a in axes):
            out[load.tensor.name] = (load.tensor, axes)
    chain = [anchor]
    while True:
        readers = [t for t in dag.tensors if not t.is_placeholder and not t.reduce_axes
                   and any(ld.tensor is chain[-1] for ld in _reads(t))]
        if len(readers) != 1 or readers[0].shape != anchor.shape or not _elementwise(readers[0]):
            break
        chain.append(readers[0])
    for t in chain:
        out[t.name] = (t, list(anchor.axes))
        for ld in _reads(t) if t is not anchor else ():
            if ld.tensor.shape == anchor.shape and ld.tensor.name not in out:
                out[ld.tensor.name] = (ld.tensor, list(anchor.axes))
    return list(out.values())


def _elementwise(t: Tensor) -> bool:
    """Every read of a same-shaped tensor is at `t`'s own index (Y[i] = F(X[i]))."""
    return all(len(ld.indices) == len(t.axes) and all(i is a for i, a in zip(ld.indices, t.axes))
               for ld in _reads(t) if ld.tensor.shape == t.shape)


LAYOUT_TEMPLATES: dict[str, TilingTemplate] = {"tiling": TilingTemplate()}
