"""Converters of PyTorch's scatter family: scatter (src, value, reduce=), scatter_add, scatter_reduce (sum, prod, amax,
amin, mean; include_self) as ONNX ScatterElements; index_put (which index_add and `x[:, idx] = v` export to) with
one integer index tensor, as ScatterElements along its axis, or one boolean mask, as Where. (Writes at constant
positions, `x[:, 2:4] = v`, are slice_scatter and select_scatter: see torch_ops.indexing.)

Duplicate indices of a plain scatter or index_put (no accumulation) are left undefined by PyTorch; tensorgen keeps
the last update (see tensorgen.graph.ops.scatter).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tensorgen.graph.frontend.torch_ops.core import ConvertError, Emitter, Formula, Shape, arg, converts, operand

INDEX = "int64"
#: PyTorch's reduce names -> ScatterElements' reduction
REDUCTIONS = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max", "amin": "min"}


def _identity(reduction: str, dtype: str) -> float | int:
    """The value a reduction starts from: what include_self=False writes where updates land before reducing."""
    if reduction in ("add", "mul"):
        return 0 if reduction == "add" else 1
    if np.issubdtype(np.dtype(dtype), np.floating):
        return -math.inf if reduction == "max" else math.inf
    info = np.iinfo(np.dtype(dtype))
    return int(info.min if reduction == "max" else info.max)


def _filled(cx: Emitter, value: float | int, shape: tuple[int, ...], dtype: str) -> str:
    """A tensor of `shape` holding `value` everywhere (a scalar constant, expanded)."""
    return cx.emit("Expand", [cx.tensor(np.array(value, dtype=dtype))], shapes=[(shape, dtype)])[0]


def _cut(cx: Emitter, src: str, shape: tuple[int, ...], dtype: str) -> str:
    """src's leading corner of `shape` (torch.scatter reads only as much of src as index covers)."""
    have = cx.value(src).shape
    if have == shape:
        return src
    if len(have) != len(shape) or any(m > n for m, n in zip(shape, have)):
        raise ConvertError(f"src of shape {list(have)} does not cover index of shape {list(shape)}")
    consts = [np.zeros(len(shape), np.int64), np.array(shape, np.int64), np.arange(len(shape), dtype=np.int64)]
    return cx.emit("Slice", [src, *map(cx.tensor, consts)], shapes=[(shape, dtype)])[0]


def _scatter_elements(cx: Emitter, x: str, axis: int, index: str, updates: str, reduction: str) -> str:
    value = cx.value(x)
    return cx.emit("ScatterElements", [x, index, updates], {"axis": axis, "reduction": reduction},
                   shapes=[(value.shape, value.dtype)])[0]


def _scatter_args(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple[str, int, str, str]:
    """(self, axis, index, src) of a scatter call; a scalar src (scatter.value) is expanded to index's shape."""
    shape, dtype = shapes[0]
    if not shape:
        raise ConvertError("scatter into a 0-d tensor is not supported")
    x = operand(cx, args[0], dtype)
    axis = int(arg(args, kwargs, 1, "dim")) % len(shape)
    index = operand(cx, arg(args, kwargs, 2, "index"), INDEX)
    ishape = cx.value(index).shape
    if len(ishape) != len(shape):
        raise ConvertError(f"index of shape {list(ishape)} must have the rank of self {list(shape)}")
    src = arg(args, kwargs, 3, "src", kwargs.get("value"))
    if cx.is_runtime(src) or isinstance(src, (np.ndarray, list)) or hasattr(src, "shape"):
        src = _cut(cx, operand(cx, src, dtype), ishape, dtype)
    else:
        src = _filled(cx, src, ishape, dtype)
    return x, axis, index, src


@converts("aten.scatter")
def _scatter(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """scatter(self, dim, index, src | value, reduce=None | 'add' | 'multiply')."""
    reduce = arg(args, kwargs, 4, "reduce")
    if reduce is not None and reduce not in ("add", "multiply"):
        raise ConvertError(f"scatter reduce={reduce!r} is not supported (add, multiply)")
    x, axis, index, src = _scatter_args(cx, args, kwargs, shapes)
    return _scatter_elements(cx, x, axis, index, src, "none" if reduce is None else REDUCTIONS[reduce])


@converts("aten.scatter_add")
def _scatter_add(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    x, axis, index, src = _scatter_args(cx, args, kwargs, shapes)
    return _scatter_elements(cx, x, axis, index, src, "add")


@converts("aten.scatter_reduce")
def _scatter_reduce(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """scatter_reduce(self, dim, index, src, reduce, include_self=True). Without include_self, the positions index
    names are first set to the reduction's identity; mean is a sum divided by how many values each position got."""
    reduce, include_self = arg(args, kwargs, 4, "reduce"), bool(arg(args, kwargs, 5, "include_self", True))
    shape, dtype = shapes[0]
    if reduce != "mean" and reduce not in REDUCTIONS:
        raise ConvertError(f"scatter_reduce reduce={reduce!r} is not supported (sum, prod, amax, amin, mean)")
    if reduce == "mean" and not np.issubdtype(np.dtype(dtype), np.floating):
        raise ConvertError(f"scatter_reduce mean of {dtype} (a floor division) is not supported; floats only")
    x, axis, index, src = _scatter_args(cx, args, kwargs, shapes)
    reduction = REDUCTIONS.get(reduce, "add")
    ishape = cx.value(index).shape
    if not include_self:
        x = _scatter_elements(cx, x, axis, index, _filled(cx, _identity(reduction, dtype), ishape, dtype), "none")
    total = _scatter_elements(cx, x, axis, index, src, reduction)
    if reduce != "mean":
        return total
    f = Formula(cx, dtype)
    count = _scatter_elements(cx, _filled(cx, int(include_self), shape, dtype), axis, index,
                              _filled(cx, 1, ishape, dtype), "add")
    return f("Div", total, f("Max", count, f.const(1)))


def _index_tensor(cx: Emitter, indices: list[Any]) -> tuple[int, Any]:
    """The position and value of the one index tensor of an index_put (the others None: whole axes)."""
    given = [(a, i) for a, i in enumerate(indices) if i is not None]
    if len(given) != 1:
        raise ConvertError(f"index_put with {len(given)} index tensors is not supported (one integer index tensor "
                           "on one axis, or one boolean mask)")
    return given[0]


@converts("aten.index_put")
def _index_put(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """index_put(self, indices, values, accumulate=False): `x[:, idx] = v` (or `+=` with accumulate)."""
    dtype = shapes[0][1]
    accumulate = bool(arg(args, kwargs, 3, "accumulate", False))
    axis, index = _index_tensor(cx, list(arg(args, kwargs, 1, "indices")))
    x, values = operand(cx, args[0], dtype), operand(cx, arg(args, kwargs, 2, "values"), dtype)
    if cx.value(cx.tensor(index)).dtype == "bool":
        return _masked_put(cx, x, axis, cx.tensor(index), values, accumulate)
    return _put_along(cx, x, axis, operand(cx, index, INDEX), values, accumulate)


def _put_along(cx: Emitter, x: str, axis: int, index: str, values: str, accumulate: bool) -> str:
    """x with `values` (broadcast to x's shape with `axis` replaced by index's dims) written (or added) at `index`
    along `axis`: ScatterElements of the values and the index flattened and spread over x's other axes."""
    shape, dtype = cx.value(x).shape, cx.value(x).dtype
    ishape = cx.value(index).shape
    count = math.prod(ishape)
    rest = tuple(shape[axis + 1:])
    indexed = tuple(shape[:axis]) + ishape + rest
    if not np.broadcast_shapes(cx.value(values).shape, indexed) == indexed:
        raise ConvertError(f"values of shape {list(cx.value(values).shape)} do not broadcast to {list(indexed)}")
    flat = tuple(shape[:axis]) + (count,) + rest
    (values,) = cx.emit("Expand", [values], shapes=[(indexed, dtype)])
    (values,) = cx.emit("Reshape", [values], shapes=[(flat, dtype)])
    (index,) = cx.emit("Reshape", [index], shapes=[((1,) * axis + (count,) + (1,) * len(rest), INDEX)])
    (index,) = cx.emit("Expand", [index], shapes=[(flat, INDEX)])
    return _scatter_elements(cx, x, axis, index, values, "add" if accumulate else "none")


def _masked_put(cx: Emitter, x: str, axis: int, mask: str, values: str, accumulate: bool) -> str:
    """x[:, mask] = v as Where(mask, v, x) (x + Where(mask, v, 0) with accumulate): v must not depend on how many
    elements the mask selects, i.e. broadcast from one of them."""
    shape, dtype = cx.value(x).shape, cx.value(x).dtype
    mshape, vshape = cx.value(mask).shape, cx.value(values).shape
    rest = tuple(shape[axis + len(mshape):])
    if tuple(shape[axis:axis + len(mshape)]) != mshape:
        raise ConvertError(f"mask of shape {list(mshape)} does not match dims {axis}.. of self {list(shape)}")
    one = tuple(shape[:axis]) + (1,) + rest  # the indexed shape with one selected element
    if len(vshape) > len(one) or np.broadcast_shapes(vshape, one) != one:
        raise ConvertError(f"values of shape {list(vshape)} for a boolean mask must broadcast to {list(one)} (a "
                           "value per selected element is not supported)")
    lifted = (1,) * (len(one) - len(vshape)) + tuple(vshape)
    spread = lifted[:axis] + (1,) * len(mshape) + lifted[axis + 1:]
    (values,) = cx.emit("Reshape", [values], shapes=[(spread, dtype)])
    (mask,) = cx.emit("Reshape", [mask], shapes=[((1,) * axis + mshape + (1,) * len(rest), "bool")])
    f = Formula(cx, dtype)
    if accumulate:
        return f("Add", x, f("Where", mask, values, f.const(0), shape=shape))
    return f("Where", mask, values, x, shape=shape)
