"""Converters of ATen's advanced indexing and of the writes into views that functionalization leaves in an exported
graph: `x[i, j]` (aten.index with several index tensors), `torch.diagonal`, and `y[:, 0] = v` (aten.copy into a
view, then aten.select_scatter / slice_scatter of it back into the base)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tensorgen.graph.frontend.torch_ops.core import (
    ConvertError,
    Emitter,
    Formula,
    Shape,
    arg,
    converts,
    operand,
    single,
)


@converts("aten.index")
def _index(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """`x[..., i, j, ...]`: the indexed axes merged into one (moved to the front first where None separates them,
    as PyTorch puts the broadcast index shape first then) and one Gather by the linear index of the broadcast index
    tensors. Negative indices count from the end."""
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    sizes = cx.value(x).shape
    given = [(axis, ix) for axis, ix in enumerate(args[1]) if ix is not None]
    axes = [axis for axis, _ in given]
    if any(cx.value(cx.tensor(ix)).dtype == "bool" for _, ix in given):
        raise ConvertError("indexing with a bool mask (its result's shape depends on the data)")
    if axes != list(range(axes[0], axes[0] + len(axes))):  # separated: the indexed axes go first
        perm = axes + [a for a in range(len(sizes)) if a not in axes]
        (x,) = cx.emit("Transpose", [x], {"perm": perm}, shapes=[(tuple(sizes[a] for a in perm), dtype)])
        sizes, axes = cx.value(x).shape, list(range(len(axes)))
    first, merged = axes[0], int(np.prod([sizes[a] for a in axes]))
    flat = (*sizes[:first], merged, *sizes[axes[-1] + 1:])
    if len(axes) > 1:
        (x,) = cx.emit("Reshape", [x], shapes=[(flat, dtype)])
    index = _linear_index(cx, [ix for _, ix in given], [sizes[a] for a in axes])
    return cx.emit("Gather", [x, index], {"axis": first}, shapes=[(shape, dtype)])[0]


def _linear_index(cx: Emitter, indices: Sequence[Any], dims: Sequence[int]) -> str:
    """The row-major index into the merged axes of sizes `dims` (each index made non-negative first): computed now
    where every index is a constant, else a formula of run-time ops."""
    strides = [int(np.prod(dims[k + 1:])) for k in range(len(dims))]
    if not any(cx.is_runtime(ix) for ix in indices):
        arrays = [np.asarray(ix.numpy() if hasattr(ix, "numpy") else ix, np.int64) for ix in indices]
        for a, n in zip(arrays, dims):
            if np.any((a < -n) | (a >= n)):
                raise ConvertError(f"an index is outside [-{n}, {n})")
        return cx.tensor(sum(np.where(a < 0, a + n, a) * s for a, n, s in zip(arrays, dims, strides)))
    f = Formula(cx, "int64")
    total = None
    for ix, n, s in zip(indices, dims, strides):
        i = operand(cx, ix, "int64")
        i = f("Where", f("Less", i, f.const(0), out="bool"), f("Add", i, f.const(n)), i)
        term = i if s == 1 else f("Mul", i, f.const(s))
        total = term if total is None else f("Add", total, term)
    return total


@converts("aten.diagonal")
def _diagonal(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """diagonal(x, offset, dim1, dim2): dim1 and dim2 moved last and merged, then a Gather of the diagonal's
    positions (a new last axis, as PyTorch)."""
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    sizes = cx.value(x).shape
    offset = int(arg(args, kwargs, 1, "offset", 0))
    d1, d2 = (int(arg(args, kwargs, i, name, default)) % len(sizes)
              for i, name, default in ((2, "dim1", 0), (3, "dim2", 1)))
    rest = [a for a in range(len(sizes)) if a not in (d1, d2)]
    n1, n2 = sizes[d1], sizes[d2]
    moved = (*(sizes[a] for a in rest), n1 * n2)
    (x,) = cx.emit("Transpose", [x], {"perm": [*rest, d1, d2]}, shapes=[(tuple(sizes[a] for a in [*rest, d1, d2]),
                                                                          dtype)])
    (x,) = cx.emit("Reshape", [x], shapes=[(moved, dtype)])
    rows = np.arange(shape[-1]) + max(-offset, 0)
    positions = rows * n2 + rows + offset
    return cx.emit("Gather", [x, cx.tensor(positions.astype(np.int64))], {"axis": len(rest)},
                   shapes=[(shape, dtype)])[0]


@converts("aten.copy")
def _copy(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """copy(dst, src): src in dst's dtype, broadcast to dst's shape (what `view[...] = src` writes)."""
    shape, dtype = single(shapes)
    src = operand(cx, args[1], dtype)
    return src if cx.value(src).shape == tuple(shape) else cx.emit("Expand", [src], shapes=[(shape, dtype)])[0]


def _write(cx: Emitter, base: Any, src: str, axis: int, positions: range, shape: Sequence[int], dtype: str) -> str:
    """`base` with the positions along `axis` replaced by src's slices in order: a Gather of src to base's shape
    (each covered position's slice) and a Where by a constant mask of the covered positions."""
    if not positions:  # an empty slice writes nothing
        return operand(cx, base, dtype)
    n = shape[axis]
    covered, source = np.zeros(n, bool), np.zeros(n, np.int64)
    covered[list(positions)], source[list(positions)] = True, np.arange(len(positions))
    (taken,) = cx.emit("Gather", [src, cx.tensor(source)], {"axis": axis}, shapes=[(tuple(shape), dtype)])
    mask = cx.tensor(covered.reshape([n if a == axis else 1 for a in range(len(shape))]))
    return cx.emit("Where", [mask, taken, operand(cx, base, dtype)], shapes=[(tuple(shape), dtype)])[0]


@converts("aten.slice_scatter")
def _slice_scatter(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """slice_scatter(base, src, dim, start, end, step): base with base[start:end:step] on dim replaced by src."""
    shape, dtype = single(shapes)
    axis = int(arg(args, kwargs, 2, "dim", 0)) % len(shape)
    start, end, step = (arg(args, kwargs, i, name, d) for i, name, d in ((3, "start", None), (4, "end", None),
                                                                           (5, "step", 1)))
    positions = range(*slice(start, end, step).indices(shape[axis]))
    return _write(cx, args[0], operand(cx, args[1], dtype), axis, positions, shape, dtype)


@converts("aten.select_scatter")
def _select_scatter(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """select_scatter(base, src, dim, index): base with position `index` of dim replaced by src (which lacks dim)."""
    shape, dtype = single(shapes)
    axis = int(args[2]) % len(shape)
    src = operand(cx, args[1], dtype)
    lifted = (*shape[:axis], 1, *shape[axis + 1:])
    (src,) = cx.emit("Reshape", [src], shapes=[(lifted, dtype)])
    index = int(args[3]) % shape[axis]
    return _write(cx, args[0], src, axis, range(index, index + 1), shape, dtype)
