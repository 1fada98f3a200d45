"""Layout templates (ALT §5.1): which layouts the search may give a task's tensors, as tile parameters.

ALT tiles the layout of every tensor a complex operator (conv, GEMM) touches, with the tiled dimensions last:
a GEMM's C becomes (M/mt, N/nt, mt, nt), A (M/mt, K/kt, mt, kt), B (K/kt, N/nt, kt, nt) — one tile size per loop
axis, shared by every tensor that axis indexes. `TilingTemplate` is that template for any stage with data reuse
(GEMM, dense, batch matmul, convolutions): a tensor dimension indexed by a plain loop axis is split by that axis'
tile; one indexed by `a * stride + window` (a convolution's input row `h * stride + rh`) is unfolded into the
overlapping tiles that a tile of `a` reads (ALT's h_t + KH - 1 rows); any other stays whole. The layout of the
stage's output is propagated along the element-wise stages after it (ALT §4.2: same shape, element-wise). Where
the epilogue adds a constant (a bias) shaped like a constant operand without its reduction dimension, a gene
(`STORE_AT`) stores it at the end of that dimension (store_at: each weight column ends with its bias).

A template is a registered rule (`LAYOUT_TEMPLATES`) with a condition (`space`: the tile parameters it offers
for a DAG, or None) and an application (`layouts`: the primitives of each tensor for chosen tiles).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tensorgen.dag import ComputeDAG, at_own_axes
from tensorgen.schedule.laid_out import sliding_read
from tensorgen.schedule.layout import LayoutPrimitive, Reorder, Split, StoreAt, Unfold, guest_fits
from tensorgen.te.expr import Expr, Load, Var, walk
from tensorgen.te.tensor import Tensor

Layouts = dict[str, list[LayoutPrimitive]]
STORE_AT = "@store_at"  # the gene (0 or 1) of a TileSpace that stores a bias in its weight (no loop axis's name)


@dataclass(frozen=True)
class TileSpace:
    """The tile parameters of a template on one DAG: for each loop axis (by name), its extent's divisors."""

    anchor: str  # the stage whose loop axes the tiles belong to
    choices: Mapping[str, tuple[int, ...]]

    def sample(self, rng: np.random.Generator) -> dict[str, int]:
        return {axis: int(rng.choice(options)) for axis, options in self.choices.items()}

    def mutate(self, tiles: Mapping[str, int], rng: np.random.Generator) -> dict[str, int]:
        """`tiles` with one axis that has a choice moved to another of its tiles (a gene of ALT's layouts)."""
        axes = [a for a, options in self.choices.items() if len(options) > 1]
        out = dict(tiles)
        if axes:
            axis = axes[int(rng.integers(len(axes)))]
            out[axis] = int(rng.choice([t for t in self.choices[axis] if t != tiles.get(axis)]))
        return out

    @property
    def size(self) -> int:
        return int(np.prod([len(c) for c in self.choices.values()]))


def _divisors(n: int, smallest: int, largest: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0 and (d == 1 or smallest <= d <= largest))


class LayoutTemplate(Protocol):
    """Which layouts a task's tensors may take: `space` (the tile parameters it offers for a DAG, or None where it
    does not apply) and `layouts` (the primitives of each tensor for chosen tiles)."""

    name: str

    def space(self, dag: ComputeDAG) -> TileSpace | None: ...

    def layouts(self, dag: ComputeDAG, tiles: Mapping[str, int]) -> Layouts: ...


@dataclass(frozen=True)
class TilingTemplate(LayoutTemplate):
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
        choices = {a.name: _divisors(a.extent, self.smallest, self.largest) for a in axes}
        if _stored(dag, anchor) is not None:
            choices[STORE_AT] = (0, 1)
        return TileSpace(anchor.name, choices)

    def layouts(self, dag: ComputeDAG, tiles: Mapping[str, int]) -> Layouts:
        anchor = dag.by_name[self.space(dag).anchor]
        stored = _stored(dag, anchor) if tiles.get(STORE_AT) else None
        out: Layouts = {}
        for t, indices in _tensors_of(dag, anchor):
            if (self.constants_only and not t.attrs.get("constant")) or (stored and t.name == stored[2]):
                continue
            dims = [_tile_of(index, anchor, tiles) for index in indices]
            if stored and t.name == stored[0]:  # the stored dimension stays whole
                dims[stored[1]] = 1
            prims = [StoreAt(stored[1], stored[2])] if stored and t.name == stored[0] else []
            prims += tiled(t.shape, dims)
            if prims:
                out[t.name] = prims
        return out


Tile = tuple[int, int] | int  # a split's tile size, or an unfold's (tile, stride)


def _tile_of(index: Expr, anchor: Tensor, tiles: Mapping[str, int]) -> Tile:
    """How a dimension read at `index` is tiled: by its axis' tile when `index` is a plain loop axis; unfolded
    into overlapping tiles when it is `a * V + window` (a convolution's input row: the rows a tile of `tiles[a]`
    outputs reads, ALT's h_t + KH - 1); else not at all (1)."""
    if isinstance(index, Var):
        return tiles.get(index.name, 1)
    read = sliding_read(index, anchor.axes)
    if read is None:
        return 1
    per_tile = tiles.get(read.axis.name, 1)
    if not 1 < per_tile < (read.axis.extent or 0):
        return 1
    span, stride = read.span(per_tile), read.stride * per_tile
    return (span, stride) if span > stride else 1


def tiled(shape: Sequence[int], tiles: Sequence[Tile]) -> list[LayoutPrimitive]:
    """Tile each dimension of `shape` (a split by a tile size, 1: untouched; an unfold by (tile, stride)) and move
    the tiles innermost, in order: ALT's N (H/ht) (W/wt) (I/it) (ht+KH-1) (wt+KW-1) it."""
    prims: list[LayoutPrimitive] = []
    outer, inner, dim = [], [], 0
    for n, t in zip(shape, tiles):
        if isinstance(t, tuple) and t[1] < t[0] < n:
            prims.append(Unfold(dim, *t))
        elif isinstance(t, int) and 1 < t < n and n % t == 0:
            prims.append(Split(dim, (n // t, t)))
        else:
            outer.append(dim)
            dim += 1
            continue
        outer.append(dim)
        inner.append(dim + 1)
        dim += 2
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


def _tensors_of(dag: ComputeDAG, anchor: Tensor) -> list[tuple[Tensor, list[Expr]]]:
    """The tensors the template lays out, each with the index the anchor reads each of its dimensions at: the
    anchor's operands, itself, and the element-wise chain after it with every same-shaped tensor that chain
    reads (at the anchor's own axes)."""
    out: dict[str, tuple[Tensor, list[Expr]]] = {}
    for load in _reads(anchor):
        if load.tensor.name not in out:
            out[load.tensor.name] = (load.tensor, list(load.indices))
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
    # a tensor that a stage outside the pattern also reads keeps its layout (a softmax after attention's scores
    # would read the tiles through the index map, and an element-wise reader at another index too)
    inside = {id(t) for t in chain}

    def kept(t: Tensor) -> bool:
        readers = [r for r in dag.tensors if r.body is not None and any(ld.tensor is t for ld in _reads(r))]
        return all(id(r) in inside for r in readers)

    return [(t, idx) for t, idx in out.values() if kept(t)]


def _stored(dag: ComputeDAG, anchor: Tensor) -> tuple[str, int, str] | None:
    """(host, dimension, guest) where a constant that a stage after the anchor reads (a bias) can be stored at the
    end of a constant operand's reduction dimension (a weight's), else None."""
    reduce = {id(a) for a in anchor.reduce_axes}
    operands = {id(ld.tensor) for ld in _reads(anchor)}
    for load in _reads(anchor):
        host = load.tensor
        if not (host.is_placeholder and host.attrs.get("constant")):
            continue
        for d, index in enumerate(load.indices):
            if not (isinstance(index, Var) and id(index) in reduce):
                continue
            for t in dag.tensors:
                for ld in _reads(t) if t.body is not None and t is not anchor else ():
                    g = ld.tensor
                    if g.is_placeholder and g.attrs.get("constant") and id(g) not in operands \
                            and g.dtype == host.dtype and guest_fits(host.shape, d, g.shape):
                        return host.name, d, g.name
    return None


def _elementwise(t: Tensor) -> bool:
    """Every read of a same-shaped tensor is at `t`'s own index (Y[i] = F(X[i]))."""
    return all(at_own_axes(ld.indices, t.axes) for ld in _reads(t) if ld.tensor.shape == t.shape)


LAYOUT_TEMPLATES: dict[str, LayoutTemplate] = {"tiling": TilingTemplate()}
