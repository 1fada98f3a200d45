"""Lowerings of the injective ops: reshapes, Transpose, Concat, Split, Slice, Gather, Pad, Expand, Resize.

Reshape-like ops take their target shape from the output Value (the frontend removed the shape and
axes inputs); each lowering still produces a computed stage, so a node always has a kernel of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from tensorgen.graph.ir import Node
from tensorgen.graph.ops.base import NUMERIC, READABLE, Args, broadcast_load, lowering
from tensorgen.te import expr as E
from tensorgen.te.ops import broadcast_shape, concatenate, reshape, transpose
from tensorgen.te.ops.common import INJECTIVE, offset
from tensorgen.te.tensor import Tensor, compute


@lowering("Reshape", "Flatten", "Squeeze", "Unsqueeze", kind="injective", dtypes=READABLE)
def _reshape(node: Node, args: Args) -> list[Tensor]:
    return [reshape(args.tensor(0), args.out_shape(), name=args.name())]


@lowering("Expand", kind="injective", dtypes=READABLE)
def _expand(node: Node, args: Args) -> list[Tensor]:
    x, shape = args.tensor(0), args.out(0).shape
    if broadcast_shape(args.value(0).shape, shape) != shape:
        raise args.error(f"input {list(args.value(0).shape)} does not broadcast to the output {list(shape)}")
    return [compute(args.out_shape(), lambda *idx: broadcast_load(x, idx), name=args.name(), tag=INJECTIVE)]


@lowering("Tile", kind="injective", dtypes=READABLE)
def _tile(node: Node, args: Args) -> list[Tensor]:
    x, shape = args.tensor(0), args.out(0).shape
    if len(shape) != x.ndim or any(o % n for o, n in zip(shape, x.shape)):
        raise args.error(f"the output {list(shape)} is not the input {list(x.shape)} repeated a whole number of times")

    def body(*idx):
        return x[tuple(i if o == n else i % n for i, o, n in zip(idx, shape, x.shape))]

    return [compute(args.out_shape(), body, name=args.name(), tag=INJECTIVE)]


@lowering("Transpose", kind="injective", dtypes=READABLE)
def _transpose(node: Node, args: Args) -> list[Tensor]:
    return [transpose(args.tensor(0), tuple(args.attr("perm")), name=args.name())]


@lowering("Concat", kind="injective", dtypes=READABLE)
def _concat(node: Node, args: Args) -> list[Tensor]:
    tensors = [args.tensor(i) for i in range(len(node.inputs)) if args.present(i)]
    return [concatenate(tensors, int(args.attr("axis")), name=args.name())]


@lowering("Split", kind="injective", dtypes=READABLE)
def _split(node: Node, args: Args) -> list[Tensor]:
    """One stage per output, each a window along the axis (sizes from the outputs' shapes)."""
    x, axis = args.tensor(0), int(args.attr("axis"))
    sizes = [args.out(k).shape[axis] for k in range(len(node.outputs))]
    if sum(sizes) != x.shape[axis]:
        raise args.error(f"outputs of sizes {sizes} do not add up to the {x.shape[axis]} elements of axis {axis}")
    results, start = [], 0
    for k, size in enumerate(sizes):
        args.expect_shape(k, x.shape[:axis] + (size,) + x.shape[axis + 1:])
        def body(*idx, start=start):
            return x[(*idx[:axis], offset(idx[axis], start), *idx[axis + 1:])]

        results.append(compute(args.out_shape(k), body, name=args.name(str(k)), tag=INJECTIVE))
        start += size
    return results


@lowering("Slice", kind="injective", dtypes=READABLE)
def _slice(node: Node, args: Args) -> list[Tensor]:
    """starts/ends are clamped by the frontend (an end of -1 with a negative step means 'through 0')."""
    x = args.tensor(0)
    first, step = [0] * x.ndim, [1] * x.ndim
    expect = list(x.shape)
    for s, e, a, t in zip(args.attr("starts"), args.attr("ends"), args.attr("axes"), args.attr("steps")):
        first[a], step[a], expect[a] = s, t, len(range(s, e, t))
    args.expect_shape(0, expect)

    def body(*idx):
        return x[tuple(offset(i if t == 1 else i * t, s) for i, s, t in zip(idx, first, step))]

    return [compute(args.out_shape(), body, name=args.name(), tag=INJECTIVE)]


@lowering("Gather", kind="injective", dtypes=READABLE)
def _gather(node: Node, args: Args) -> list[Tensor]:
    """A constant scalar index is a literal; tensor indices may be negative (counted from the end). Indices
    outside [-n, n) are an error, as in ONNX Runtime: constant ones at import (onnx_normalize), run-time ones
    where the model's executor checks them before this kernel runs (graph/executor.py)."""
    x, axis = args.tensor(0), int(args.attr("axis"))
    if args.value(1).dtype not in ("int32", "int64"):
        raise args.error(f"indices must be int32 or int64, got {args.value(1).dtype}")
    dim, rank = x.shape[axis], len(args.value(1).shape)
    args.expect_shape(0, x.shape[:axis] + args.value(1).shape + x.shape[axis + 1:])
    out_rank = len(args.out(0).shape)
    literal = args.scalar(1)
    indices = None if literal is not None else args.tensor(1)

    def body(*idx):
        idx = idx[:out_rank]
        if indices is None:
            i: Any = int(literal) % dim
        else:
            i = indices[idx[axis:axis + rank] if rank else (0,)]
            i = E.select(i < 0, i + dim, i)
        return x[(*idx[:axis], i, *idx[axis + rank:])]

    return [compute(args.out_shape(), body, name=args.name(), tag=INJECTIVE)]


def _reflect(j: Any, n: int, before: bool, after: bool) -> Any:
    if before:
        j = E.absolute(j)
    if after:
        j = (n - 1) - E.absolute((n - 1) - j)
    return j


def _edge(j: Any, n: int, before: bool, after: bool) -> Any:
    if before:
        j = E.max_expr(j, 0)
    if after:
        j = E.min_expr(j, n - 1)
    return j


PAD_MODES: dict[str, Callable[[Any, int, bool, bool], Any]] = {"reflect": _reflect, "edge": _edge}


@lowering("Pad", kind="injective")
def _pad(node: Node, args: Args) -> list[Tensor]:
    """Constant, reflect or edge padding; negative pads crop."""
    x, mode = args.tensor(0), args.attr("mode")
    rank = len(args.value(0).shape)
    pads = tuple(args.attr("pads"))
    before, after = pads[:rank], pads[rank:]
    if mode != "constant" and mode not in PAD_MODES:
        raise args.error(f"mode {mode!r} is not supported (constant, reflect, edge)")
    if mode == "reflect" and any(p >= n for p, n in zip(pads, x.shape * 2)):
        raise args.error(f"reflect pads {list(pads)} must be smaller than the dims {list(x.shape)}")
    args.expect_shape(0, [b + n + a for b, n, a in zip(before, x.shape, after)])
    fill = args.literal(float(args.attr("value")), x.dtype) if mode == "constant" else None

    def body(*idx):
        conds, src = [], []
        for i, n, b, a in zip(idx, x.shape, before, after):
            j = offset(i, -b)
            if mode == "constant":
                conds += ([i >= b] if b > 0 else []) + ([i < b + n] if a > 0 else [])
            else:
                j = PAD_MODES[mode](j, n, b > 0, a > 0)
            src.append(j)
        inner = x[tuple(src)]
        return E.select(E.all_of(*conds), inner, fill) if conds else inner

    return [compute(args.out_shape(), body, name=args.name(), tag=INJECTIVE, attrs={"pads": pads, "mode": mode})]


# Resize (nearest): where output position y reads along one axis, after the ONNX reference. Each entry
# maps (y, scale, input size, output size as scale * input, integer output size) to a source coordinate;
# it is written once for NumPy arrays and te expressions alike.
Coordinate = Callable[[Any, float, int, float, int], Any]
COORDINATES: dict[str, Coordinate] = {
    "half_pixel": lambda y, s, n, w, m: (y + 0.5) / s - 0.5,
    "asymmetric": lambda y, s, n, w, m: y / s,
    # the resized length of these two is the output's (m), as ONNX Runtime and PyTorch take it, not scale * n (w):
    # align_corners at scale 0.5 of 5 -> 3 reads 0, 2, 4, not 0, 8/3, ...
    "pytorch_half_pixel": lambda y, s, n, w, m: (y + 0.5) / s - 0.5 if m != 1 else y * 0.0,
    "align_corners": lambda y, s, n, w, m: y * (n - 1) / (m - 1) if m != 1 else y * 0.0,
    "half_pixel_symmetric": lambda y, s, n, w, m: n / 2 * (1 - m / w) + (y + 0.5) / s - 0.5,
}
# nearest_mode: how a coordinate becomes an index (`f` is np or tensorgen.te.expr)
ROUNDINGS: dict[str, Callable[[Any, Any], Any]] = {
    "round_prefer_floor": lambda x, f: f.ceil(x - 0.5),
    "round_prefer_ceil": lambda x, f: f.floor(x + 0.5),
    "floor": lambda x, f: f.floor(x),
    "ceil": lambda x, f: f.ceil(x),
}


def _floor_affine(table: np.ndarray, n: int, ratios: Sequence[Fraction]) -> tuple[int, int, int, bool] | None:
    """(p, q, r, clamp) with table[y] == clip((y * p + q) // r, 0, n - 1), if such small integers exist."""
    y = np.arange(len(table))
    for ratio in ratios:
        for p, r in ((ratio.numerator, ratio.denominator), (2 * ratio.numerator, 2 * ratio.denominator)):
            q = np.arange(-2 * (p + r), 2 * (p + r) + 1)[:, None]
            raw = (y[None, :] * p + q) // r
            hits = np.flatnonzero((np.clip(raw, 0, n - 1) == table[None, :]).all(axis=1))
            if hits.size:
                row = raw[hits[0]]
                return p, int(q[hits[0], 0]), r, bool((row < 0).any() or (row > n - 1).any())
    return None


def _resize_index(args: Args, axis: int, o: E.Expr) -> E.Expr:
    """The input index output index `o` reads along `axis`: integer arithmetic where the nearest-neighbour
    table is a clamped floor of an affine function (integer scales, halves, ...), else the float64 formula."""
    n, m = args.value(0).shape[axis], args.out(0).shape[axis]
    scale = float(args.attr("scales")[axis])
    mode, rounding = args.attr("coordinate_transformation_mode"), args.attr("nearest_mode")
    if mode not in COORDINATES or rounding not in ROUNDINGS:
        raise args.error(f"coordinate_transformation_mode={mode!r} / nearest_mode={rounding!r} is not supported")
    coordinate, round_fn = COORDINATES[mode], ROUNDINGS[rounding]
    table = np.clip(round_fn(coordinate(np.arange(m, dtype=np.float64), scale, n, scale * n, m), np), 0, n - 1)
    fit = _floor_affine(table.astype(np.int64), n, [Fraction(n, m), Fraction(1 / scale).limit_denominator(64)])
    if fit is not None:
        p, q, r, clamp = fit
        index = o * p if p != 1 else o
        index = offset(index, q) if q else index
        index = index // r if r != 1 else index
        return E.min_expr(E.max_expr(index, 0), n - 1) if clamp else index
    x = coordinate(E.cast(o, "float64"), scale, n, scale * n, m)
    return E.min_expr(E.max_expr(E.cast(round_fn(x, E), "int32"), 0), n - 1)


def _linear_taps(args: Args, axis: int, o: E.Expr) -> list[tuple[E.Expr, E.Expr | None]]:
    """The input indices output index `o` interpolates along `axis` and their weights (None: the axis is not
    resized): as ONNX Runtime, the source coordinate clamped to [0, n - 1] in float32, its floor and the next."""
    n, m = args.value(0).shape[axis], args.out(0).shape[axis]
    scale = float(args.attr("scales")[axis])
    if n == m and scale == 1.0:
        return [(o, None)]
    mode = args.attr("coordinate_transformation_mode")
    if mode not in COORDINATES:
        raise args.error(f"coordinate_transformation_mode={mode!r} is not supported")
    x = E.min_expr(E.max_expr(COORDINATES[mode](E.cast(o, "float32"), scale, n, scale * n, m), 0.0), float(n - 1))
    low = E.floor(x)
    below = E.cast(low, "int32")
    return [(below, 1.0 - (x - low)), (E.min_expr(below + 1, n - 1), x - low)]


@lowering("Resize", kind="injective", dtypes=NUMERIC)
def _resize(node: Node, args: Args) -> list[Tensor]:
    """Nearest-neighbour resize (every output element copies one input element) or linear (a weighted sum of the
    2^k input elements around it, k the resized axes)."""
    x = args.tensor(0)
    if len(args.attr("scales")) != x.ndim:
        raise args.error(f"scales {list(args.attr('scales'))} need one entry per axis of {list(x.shape)}")
    if args.attr("mode") == "nearest":
        return [compute(args.out_shape(), lambda *idx: x[tuple(_resize_index(args, a, o) for a, o in enumerate(idx))],
                        name=args.name(), tag=INJECTIVE)]
    if not E.is_float(x.dtype):
        raise args.error(f"linear Resize of {x.dtype} (only of floating-point tensors)")

    def body(*idx):
        total = None
        for corner in itertools.product(*(_linear_taps(args, a, o) for a, o in enumerate(idx))):
            term = x[tuple(index for index, _ in corner)]
            for _, weight in corner:
                term = term * weight if weight is not None else term
            total = term if total is None else total + term
        return total

    return [compute(args.out_shape(), body, name=args.name(), tag=INJECTIVE)]
