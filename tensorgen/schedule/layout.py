"""Data layouts as compositions of layout primitives (ALT §4.1): split, reorder, fuse, unfold, pad, store_at and
their inverses (fuse, reorder, split, fold, unpad, decouple_at).

A primitive transforms a tensor's layout, not a loop nest. A `Layout` is what a sequence of primitives makes of a
tensor of `shape`: its new dimensions, outer to inner, each a mixed-radix number whose digits (`Part`s) are
`(original dim // place) % extent`. Split, reorder and fuse regroup digits (a bijection: every element once);
pad lengthens a digit past its dimension (the extra elements read as zero); unfold makes two overlapping digits
of one dimension, tile index `t` and offset `b` with `i = t * stride + b` (an element in several tiles: the
sliding-window input of a convolution cut into tiles that overlap by the window); store_at lengthens a dimension by
one place that holds another tensor, the guest (a dense layer's bias stored after each column of its weight: the
inner product and the bias add read one buffer, ALT §4.1; constants only, packed together at build time).

`source_index` maps a new-layout index back to the element it holds (with `in_bounds`, false on padding):
how a stage computes a tensor in its new layout. `index` maps an element to its new-layout place: how a reader
reads it (an unfolded dimension needs the reader's tile, `tiles={dim: tile index}`). `pack` and `unpack` do the
same to NumPy arrays (constants at build time, test oracles).

Primitives are small registered dataclasses (`LAYOUT_PRIMITIVES`), replayable from JSON and printed as Python,
like the loop steps: `split(1, [4, 16])`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from tensorgen.errors import ScheduleError
from tensorgen.te.expr import (
    Expr,
    ExprLike,
    all_of,
    as_expr,
    cmp,
    const,
)

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Part:
    """One digit of a new dimension: `(i[dim] // place) % extent` of original index `i`. An unfold's tile
    digit has `window` > 0, the tile size: its dimension's other digit is the offset in the tile."""

    dim: int
    place: int
    extent: int
    window: int = 0


@dataclass(frozen=True)
class Layout:
    """A tensor of `shape` laid out as `dims`: new dimensions outer to inner, each its digits outer to inner.
    `guests`: (original dimension d, tensor name) of each tensor stored at place shape[d] of d (store_at)."""

    shape: tuple[int, ...]
    dims: tuple[tuple[Part, ...], ...]
    guests: tuple[tuple[int, str], ...] = ()

    @classmethod
    def identity(cls, shape: Sequence[int]) -> Layout:
        shape = tuple(int(n) for n in shape)
        return cls(shape, tuple((Part(d, 1, n),) if n > 1 else () for d, n in enumerate(shape)))

    @classmethod
    def of(cls, shape: Sequence[int], primitives: Sequence[LayoutPrimitive]) -> Layout:
        layout = cls.identity(shape)
        for p in primitives:
            layout = p.apply(layout)
        return layout

    @property
    def new_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(p.extent for p in parts) for parts in self.dims)

    @property
    def is_padded(self) -> bool:
        """Whether some new-layout places hold no element (padding, or an unfold's last tile past the end)."""
        return any(self.reach(d) > n for d, n in enumerate(self.shape))

    @property
    def overlaps(self) -> bool:
        """Whether an element has several places (an unfold)."""
        return any(p.window for parts in self.dims for p in parts)

    def _digits(self, d: int) -> list[tuple[int, int, Part]]:
        """Dimension d's digits as (new dimension, position in it, part)."""
        return [(g, k, p) for g, parts in enumerate(self.dims) for k, p in enumerate(parts) if p.dim == d]

    def reach(self, d: int) -> int:
        """One past the largest index of dimension d that a new-layout place points to."""
        return sum((p.extent - 1) * p.place for _, _, p in self._digits(d)) + 1

    # ---- index maps -------------------------------------------------------------------------------------

    def source_index(self, axes: Sequence[ExprLike]) -> tuple[Expr, ...]:
        """The original index of the element at new-layout index `axes`."""
        terms: list[Expr] = [const(0)] * len(self.shape)
        for parts, axis in zip(self.dims, axes, strict=True):
            axis, inner = as_expr(axis), math.prod(p.extent for p in parts)
            for k, p in enumerate(parts):
                inner //= p.extent
                digit = axis // inner if inner > 1 else axis
                digit = digit % p.extent if k > 0 else digit  # the outermost digit is below its extent already
                terms[p.dim] = terms[p.dim] + (digit * p.place if p.place != 1 else digit)
        return tuple(terms)

    def in_bounds(self, axes: Sequence[ExprLike]) -> Expr | None:
        """The condition that new-layout index `axes` holds an element (None: every place does)."""
        src = self.source_index(axes)
        conds = [cmp("lt", src[d], n) for d, n in enumerate(self.shape) if self.reach(d) > n]
        return all_of(*conds) if conds else None

    def index(self, indices: Sequence[ExprLike], tiles: Mapping[int, ExprLike] | None = None) -> tuple[Expr, ...]:
        """The new-layout index of the element at original `indices`. For an unfolded dimension d the reader
        names its tile, `tiles[d]` (the element is in several)."""
        indices = [as_expr(i) for i in indices]
        if len(indices) != len(self.shape):
            raise ScheduleError(f"layout of a {len(self.shape)}-d tensor indexed with {len(indices)} indices")
        digit: dict[tuple[int, int], Expr] = {}
        for d in range(len(self.shape)):
            digits = self._digits(d)
            tile = next(((g, k, p) for g, k, p in digits if p.window), None)
            if tile is not None:
                if not tiles or d not in tiles:
                    raise ScheduleError(f"dimension {d} is unfolded: reading it needs the reader's tile")
                (g, k, p), t = tile, as_expr(tiles[d])
                digit[g, k] = t
                digit.update({(g2, k2): indices[d] - t * p.place for g2, k2, _ in digits if (g2, k2) != (g, k)})
                continue
            outermost = max(digits, key=lambda x: x[2].place, default=None)
            for g, k, p in digits:
                e = indices[d] // p.place if p.place != 1 else indices[d]
                digit[g, k] = const(0) if p.extent == 1 else e if (g, k, p) == outermost else e % p.extent
        out = []
        for g, parts in enumerate(self.dims):
            value: Expr = const(0)
            inner = 1
            for k in reversed(range(len(parts))):
                value = digit[g, k] * inner + value if inner != 1 else digit[g, k] + value
                inner *= parts[k].extent
            out.append(value)
        return tuple(out)

    def guest_index(self, d: int, guest_shape: Sequence[int], indices: Sequence[ExprLike]) -> tuple[Expr, ...]:
        """The original index (past the end of dimension d) of element `indices` of the guest of `guest_shape`
        stored at d: its indices go to the other dimensions in order, extent-1 dimensions of either aside."""
        rest = iter([as_expr(i) for i, n in zip(indices, guest_shape) if n != 1])
        return tuple(const(n) if e == d else (const(0) if n == 1 else next(rest)) for e, n in enumerate(self.shape))

    # ---- arrays -----------------------------------------------------------------------------------------

    def _grid(self) -> list[np.ndarray]:
        """For every new-layout place (row-major), its original index, per original dimension."""
        grid = np.indices(self.new_shape, dtype=np.int64).reshape(len(self.new_shape), -1)
        src = [np.zeros(grid.shape[1], np.int64) for _ in self.shape]
        for parts, axis in zip(self.dims, grid):
            inner = math.prod(p.extent for p in parts)
            for p in parts:
                inner //= p.extent
                src[p.dim] += (axis // inner) % p.extent * p.place
        return src

    def _sources(self) -> tuple[np.ndarray, np.ndarray]:
        """For every new-layout place (row-major), its original flat index and whether it holds an element."""
        src = self._grid()
        valid = np.ones(len(src[0]) if src else 1, bool)
        for d, n in enumerate(self.shape):
            valid &= src[d] < n
        return _flat(src, self.shape, valid.shape[0]), valid

    def _transposition(self) -> tuple[list[int], list[int]] | None:
        """For a layout that only regroups digits (no padding, unfold or guest): the extents of the original
        array's digits (each dimension's, outer to inner) and the order the new layout takes them in; else None."""
        parts = [p for dim in self.dims for p in dim]
        levels = sorted(range(len(parts)), key=lambda k: (parts[k].dim, -parts[k].place, k))
        if self.guests or any(p.window for p in parts):
            return None
        for d, n in enumerate(self.shape):
            place = 1
            for k in reversed([k for k in levels if parts[k].dim == d]):
                if parts[k].place != place:
                    return None
                place *= parts[k].extent
            if place != n:
                return None
        return [parts[k].extent for k in levels], [levels.index(k) for k in range(len(parts))]

    def pack(self, array: np.ndarray, guests: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """`array` (its own layout) in this layout; padding places hold 0, a guest's places `guests[name]`."""
        if tuple(array.shape) != self.shape:
            raise ScheduleError(f"layout for shape {list(self.shape)} applied to an array of {list(array.shape)}")
        moved = self._transposition()
        if moved is not None:  # a transpose of the digits: no index arrays (a weight of 10^8 elements)
            digits, order = moved
            return np.ascontiguousarray(array.reshape(digits).transpose(order)).reshape(self.new_shape)
        flat, valid = self._sources()
        out = np.where(valid, array.reshape(-1)[flat], 0).astype(array.dtype)
        src = self._grid() if self.guests else []
        for d, name in self.guests:
            if guests is None or name not in guests:
                raise ScheduleError(f"pack: the layout stores {name!r} at dimension {d}: its array is needed")
            rest = [e for e in range(len(self.shape)) if e != d]
            guest = np.asarray(guests[name]).reshape([self.shape[e] for e in rest])
            at = src[d] == self.shape[d]
            for e in rest:
                at &= src[e] < self.shape[e]
            out[at] = guest.reshape(-1)[_flat([src[e][at] for e in rest], guest.shape, int(at.sum()))]
        return out.reshape(self.new_shape)

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """The array in its own layout from `packed` (this layout): the inverse of pack."""
        if tuple(packed.shape) != self.new_shape:
            raise ScheduleError(f"layout of shape {list(self.new_shape)} unpacks an array of {list(packed.shape)}")
        moved = self._transposition()
        if moved is not None:
            digits, order = moved
            return np.ascontiguousarray(packed.reshape([digits[k] for k in order]).transpose(np.argsort(order))) \
                .reshape(self.shape)
        flat, valid = self._sources()
        out = np.zeros(math.prod(self.shape), packed.dtype)
        out[flat[valid]] = packed.reshape(-1)[valid]
        return out.reshape(self.shape)


def _flat(src: Sequence[np.ndarray], shape: Sequence[int], count: int) -> np.ndarray:
    """Flat indices into `shape` of the per-dimension indices `src` (clamped into range)."""
    if not shape:
        return np.zeros(count, np.int64)
    return np.ravel_multi_index([np.minimum(s, n - 1) for s, n in zip(src, shape)], tuple(shape))


def guest_fits(host: Sequence[int], d: int, guest: Sequence[int]) -> bool:
    """Whether a tensor of shape `guest` can be stored at dimension d of one of shape `host` (store_at): its
    extents are the host's other ones, in order, extent-1 dimensions of either aside."""
    return [n for n in guest if n != 1] == [n for e, n in enumerate(host) if e != d and n != 1]


# ---------------------------------------------------------------------------------------------------------
# primitives

LAYOUT_PRIMITIVES: dict[str, type[LayoutPrimitive]] = {}


def layout_primitive(cls: type[LayoutPrimitive]) -> type[LayoutPrimitive]:
    """Register a primitive by its `name` (JSON records and printed programs name it)."""
    LAYOUT_PRIMITIVES[cls.name] = cls
    return cls


@dataclass(frozen=True)
class LayoutPrimitive:
    name: ClassVar[str] = ""

    def apply(self, layout: Layout) -> Layout:
        raise NotImplementedError

    def inverse(self, before: Layout) -> LayoutPrimitive:
        """The primitive that takes `self.apply(before)` back to `before`'s shape."""
        raise NotImplementedError

    def to_json(self) -> list:
        return [self.name, *(list(v) if isinstance(v, tuple) else v for v in astuple(self))]

    @staticmethod
    def from_json(record: Sequence) -> LayoutPrimitive:
        name, *fields = record
        if name not in LAYOUT_PRIMITIVES:
            raise ScheduleError(f"unknown layout primitive {name!r}; known: {sorted(LAYOUT_PRIMITIVES)}")
        return LAYOUT_PRIMITIVES[name](*(tuple(f) if isinstance(f, list) else f for f in fields))

    def to_python(self) -> str:
        return f"{self.name}({', '.join(repr(list(v) if isinstance(v, tuple) else v) for v in astuple(self))})"


def _dim(layout: Layout, dim: int, what: str) -> tuple[Part, ...]:
    if not 0 <= dim < len(layout.dims):
        raise ScheduleError(f"{what}: dimension {dim} of a {len(layout.dims)}-d layout")
    return layout.dims[dim]


def _replace(layout: Layout, start: int, stop: int, new: Sequence[tuple[Part, ...]]) -> Layout:
    return Layout(layout.shape, layout.dims[:start] + tuple(new) + layout.dims[stop:], layout.guests)


@layout_primitive
@dataclass(frozen=True)
class Split(LayoutPrimitive):
    """Dimension `dim` into dimensions of `factors` (outer to inner; their product is its extent)."""

    name: ClassVar[str] = "split"
    dim: int
    factors: tuple[int, ...]

    def apply(self, layout: Layout) -> Layout:
        parts = list(_dim(layout, self.dim, "split"))
        extent = math.prod(p.extent for p in parts)
        if not self.factors or any(f < 1 for f in self.factors) or math.prod(self.factors) != extent:
            raise ScheduleError(f"split of dimension {self.dim} ({extent}) into {list(self.factors)}: "
                                f"the factors must multiply to {extent}")
        groups: list[tuple[Part, ...]] = []
        for f in reversed(self.factors):
            taken: list[Part] = []
            while f > 1:
                p = parts.pop()
                if f % p.extent == 0:
                    taken.insert(0, p)
                    f //= p.extent
                elif p.extent % f == 0 and not _unfolded(layout, p.dim):
                    parts.append(Part(p.dim, p.place * f, p.extent // f))
                    taken.insert(0, Part(p.dim, p.place, f))
                    f = 1
                else:
                    raise ScheduleError(f"split of dimension {self.dim} into {list(self.factors)} cuts a digit of "
                                        f"extent {p.extent} by {f}: split it so that one divides the other "
                                        f"(and an unfolded dimension's tiles not at all)")
            groups.insert(0, tuple(taken))
        groups[0] = (*parts, *groups[0])  # digits of extent 1 left over stay (an unfold's single tile)
        return _replace(layout, self.dim, self.dim + 1, groups)

    def inverse(self, before: Layout) -> LayoutPrimitive:
        return Fuse(self.dim, self.dim + len(self.factors) - 1)


@layout_primitive
@dataclass(frozen=True)
class Reorder(LayoutPrimitive):
    """New dimension k is old dimension perm[k]."""

    name: ClassVar[str] = "reorder"
    perm: tuple[int, ...]

    def apply(self, layout: Layout) -> Layout:
        if sorted(self.perm) != list(range(len(layout.dims))):
            raise ScheduleError(f"reorder {list(self.perm)} is no permutation of {len(layout.dims)} dimensions")
        return Layout(layout.shape, tuple(layout.dims[p] for p in self.perm), layout.guests)

    def inverse(self, before: Layout) -> LayoutPrimitive:
        return Reorder(tuple(int(i) for i in np.argsort(self.perm)))


@layout_primitive
@dataclass(frozen=True)
class Fuse(LayoutPrimitive):
    """Dimensions first..last (adjacent, inclusive) into one."""

    name: ClassVar[str] = "fuse"
    first: int
    last: int

    def apply(self, layout: Layout) -> Layout:
        if not 0 <= self.first <= self.last < len(layout.dims):
            raise ScheduleError(f"fuse {self.first}..{self.last} of a {len(layout.dims)}-d layout")
        merged: list[Part] = []
        for p in (p for parts in layout.dims[self.first:self.last + 1] for p in parts):
            outer = merged[-1] if merged else None
            if outer and outer.dim == p.dim and not outer.window and outer.place == p.place * p.extent:
                merged[-1] = Part(p.dim, p.place, p.extent * outer.extent)  # adjacent digits: one again
            else:
                merged.append(p)
        return _replace(layout, self.first, self.last + 1, [tuple(merged)])

    def inverse(self, before: Layout) -> LayoutPrimitive:
        return Split(self.first, before.new_shape[self.first:self.last + 1])


def _resized(layout: Layout, dim: int, extent: int, guests: tuple[tuple[int, str], ...] | None = None) -> Layout:
    """`layout` with whole dimension `dim` (see _whole) of `extent` places, and `guests` (default: the same)."""
    (p,) = layout.dims[dim]
    resized = _replace(layout, dim, dim + 1, [(Part(p.dim, 1, extent),)])
    return resized if guests is None else Layout(resized.shape, resized.dims, guests)


def _unfolded(layout: Layout, d: int) -> bool:
    return any(p.window and p.dim == d for parts in layout.dims for p in parts)


def _whole(layout: Layout, dim: int, what: str) -> Part:
    """Dimension `dim` when it is one digit holding its original dimension from place 1 (unsplit, unfused)."""
    parts = _dim(layout, dim, what)
    if len(parts) != 1 or len(layout._digits(parts[0].dim)) != 1:
        raise ScheduleError(f"{what} applies to a dimension that is not split, fused or unfolded; "
                            f"dimension {dim} is")
    return parts[0]


@layout_primitive
@dataclass(frozen=True)
class Unfold(LayoutPrimitive):
    """Dimension `dim` (D) into overlapping tiles: (ceil((D - tile) / stride) + 1, tile), tile t holding elements
    t * stride .. t * stride + tile - 1 (ALT's overlapped tiling of a convolution's input)."""

    name: ClassVar[str] = "unfold"
    dim: int
    tile: int
    stride: int

    def apply(self, layout: Layout) -> Layout:
        p = _whole(layout, self.dim, "unfold")
        if not 1 <= self.stride < self.tile < p.extent:
            raise ScheduleError(f"unfold of dimension {self.dim} ({p.extent}): need 1 <= stride ({self.stride}) "
                                f"< tile ({self.tile}) < {p.extent} (tiles that do not overlap are a split, one "
                                f"tile of all is the dimension itself)")
        tiles = -(-(p.extent - self.tile) // self.stride) + 1
        return _replace(layout, self.dim, self.dim + 1,
                        [(Part(p.dim, self.stride, tiles, self.tile),), (Part(p.dim, 1, self.tile),)])

    def inverse(self, before: Layout) -> LayoutPrimitive:
        return Fold(self.dim, before.new_shape[self.dim])


@layout_primitive
@dataclass(frozen=True)
class Fold(LayoutPrimitive):
    """The inverse of unfold: dimensions dim (tiles) and dim + 1 (offsets) back into one of `extent`."""

    name: ClassVar[str] = "fold"
    dim: int
    extent: int

    def apply(self, layout: Layout) -> Layout:
        tiles, offsets = _dim(layout, self.dim, "fold"), _dim(layout, self.dim + 1, "fold")
        if len(tiles) != 1 or len(offsets) != 1 or not tiles[0].window or tiles[0].dim != offsets[0].dim:
            raise ScheduleError(f"fold of dimensions {self.dim}, {self.dim + 1}: they are no unfolded pair")
        return _replace(layout, self.dim, self.dim + 2, [(Part(tiles[0].dim, 1, self.extent),)])

    def inverse(self, before: Layout) -> LayoutPrimitive:
        tiles, offsets = before.dims[self.dim], before.dims[self.dim + 1]
        return Unfold(self.dim, offsets[0].extent, tiles[0].place)


@layout_primitive
@dataclass(frozen=True)
class Pad(LayoutPrimitive):
    """Dimension `dim` lengthened by `amount` places at its end, which hold zeros (alignment)."""

    name: ClassVar[str] = "pad"
    dim: int
    amount: int

    def apply(self, layout: Layout) -> Layout:
        p = _whole(layout, self.dim, "pad")
        if self.amount < 0:
            raise ScheduleError(f"pad of dimension {self.dim} by {self.amount}")
        return _resized(layout, self.dim, p.extent + self.amount)

    def inverse(self, before: Layout) -> LayoutPrimitive:
        return Unpad(self.dim, self.amount)


@layout_primitive
@dataclass(frozen=True)
class Unpad(LayoutPrimitive):
    """The inverse of pad: dimension `dim` shortened by `amount` places (which must be padding)."""

    name: ClassVar[str] = "unpad"
    dim: int
    amount: int

    def apply(self, layout: Layout) -> Layout:
        p = _whole(layout, self.dim, "unpad")
        padding = p.extent - layout.shape[p.dim] - sum(d == p.dim for d, _ in layout.guests)
        if not 0 <= self.amount <= padding:
            raise ScheduleError(f"unpad of dimension {self.dim} by {self.amount}: it has {padding} places of padding")
        return _resized(layout, self.dim, p.extent - self.amount)

    def inverse(self, before: Layout) -> LayoutPrimitive:
        return Pad(self.dim, self.amount)


@layout_primitive
@dataclass(frozen=True)
class StoreAt(LayoutPrimitive):
    """Tensor `guest` stored at the end of dimension `dim` (which gets one more place, ALT's store_at): element i of
    the guest sits where the other dimensions' index is i (the guest's shape is this tensor's without `dim`,
    extent-1 dimensions aside). A dense layer's bias stored at its weight's reduction dimension: each column ends
    with its bias. Constants only (lay_out): they are packed into one buffer at build time."""

    name: ClassVar[str] = "store_at"
    dim: int
    guest: str

    def apply(self, layout: Layout) -> Layout:
        p = _whole(layout, self.dim, "store_at")
        if p.extent != layout.shape[p.dim] or any(g == self.guest for _, g in layout.guests):
            raise ScheduleError(f"store_at of {self.guest!r} at dimension {self.dim}: the dimension must be neither "
                                f"padded nor hold a guest already, and {self.guest!r} be stored once")
        return _resized(layout, self.dim, p.extent + 1, (*layout.guests, (p.dim, self.guest)))

    def inverse(self, before: Layout) -> LayoutPrimitive:
        return DecoupleAt(self.dim, self.guest)


@layout_primitive
@dataclass(frozen=True)
class DecoupleAt(LayoutPrimitive):
    """The inverse of store_at: dimension `dim` loses its last place, where `guest` was stored."""

    name: ClassVar[str] = "decouple_at"
    dim: int
    guest: str

    def apply(self, layout: Layout) -> Layout:
        p = _whole(layout, self.dim, "decouple_at")
        if (p.dim, self.guest) not in layout.guests or p.extent != layout.shape[p.dim] + 1:
            raise ScheduleError(f"decouple_at of {self.guest!r} at dimension {self.dim}: it is not stored there")
        return _resized(layout, self.dim, p.extent - 1, tuple(g for g in layout.guests if g != (p.dim, self.guest)))

    def inverse(self, before: Layout) -> LayoutPrimitive:
        return StoreAt(self.dim, self.guest)


def inverse_primitives(shape: Sequence[int], primitives: Sequence[LayoutPrimitive]) -> list[LayoutPrimitive]:
    """The primitives that take `Layout.of(shape, primitives)` back to `shape`'s own layout."""
    layouts = [Layout.identity(shape)]
    for p in primitives:
        layouts.append(p.apply(layouts[-1]))
    return [p.inverse(before) for p, before in zip(reversed(primitives), reversed(layouts[:-1]))]
