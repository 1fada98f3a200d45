"""Converters of ATen's reductions: sums, means, extremes and their indices, variance and norms."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorgen.graph.frontend.torch_ops.core import (
    Converter,
    ConvertError,
    Emitter,
    Shape,
    arg,
    binary,
    converts,
    onnx_type,
    operand,
    single,
)


def reduce_axes(cx: Emitter, x: str, dims: Any) -> list[int]:
    """The axes `dims` names: all where it is None or empty."""
    rank = len(cx.value(x).shape)
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return list(range(rank))
    return sorted(int(d) % rank for d in (dims if isinstance(dims, (list, tuple)) else [dims]))


def _reduce(op: str) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        shape, dtype = single(shapes)
        x = operand(cx, args[0], dtype)
        rank, axes = len(cx.value(x).shape), reduce_axes(cx, x, arg(args, kwargs, 1, "dim"))
        keepdims = bool(arg(args, kwargs, 2, "keepdim", False))
        if op == "ReduceMean" and keepdims and rank >= 3 and axes == list(range(2, rank)):
            return cx.emit("GlobalAveragePool", [x], shapes=[(shape, dtype)])[0]  # as ONNX models write it
        attrs = {"axes": axes, "keepdims": int(keepdims), "noop_with_empty_axes": 0}
        return cx.emit(op, [x], attrs, shapes=[(shape, dtype)])[0]

    return convert


converts("aten.mean")(_reduce("ReduceMean"))
converts("aten.sum")(_reduce("ReduceSum"))
converts("aten.amax")(_reduce("ReduceMax"))
converts("aten.amin")(_reduce("ReduceMin"))
converts("aten.prod")(_reduce("ReduceProd"))


@converts("aten.var")
def _var(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """var(x, dim, correction, keepdim): the mean of squared deviations from the mean, times n / (n - correction)."""
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    full, axes = cx.value(x).shape, reduce_axes(cx, x, arg(args, kwargs, 1, "dim"))
    count = int(np.prod([full[a] for a in axes]))
    correction = 1.0 if kwargs.get("correction") is None else float(kwargs["correction"])  # keyword-only in ATen
    keepdim = bool(kwargs.get("keepdim", False))
    kept = tuple(1 if d in axes else n for d, n in enumerate(full))
    reduce = {"axes": axes, "keepdims": 1, "noop_with_empty_axes": 0}
    (mean,) = cx.emit("ReduceMean", [x], reduce, shapes=[(kept, dtype)])
    (dev,) = cx.emit("Sub", [x, mean], shapes=[(full, dtype)])
    (sq,) = cx.emit("Mul", [dev, dev], shapes=[(full, dtype)])
    (total,) = cx.emit("ReduceSum", [sq], {**reduce, "keepdims": int(keepdim)}, shapes=[(shape, dtype)])
    return cx.emit("Div", [total, cx.tensor(np.array(max(count - correction, 0), dtype=dtype))],
                   shapes=[(shape, dtype)])[0]


@converts("aten.linalg_vector_norm")
def _vector_norm(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """The 2-norm (sqrt of the sum of squares), 1-norm (sum of |x|) or inf-norm (max |x|) over `dim`."""
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    order = float(arg(args, kwargs, 1, "ord", 2))
    axes = reduce_axes(cx, x, arg(args, kwargs, 2, "dim"))
    attrs = {"axes": axes, "keepdims": int(bool(arg(args, kwargs, 3, "keepdim", False))), "noop_with_empty_axes": 0}
    full = cx.value(x).shape
    if order == 2:
        (sq,) = cx.emit("Mul", [x, x], shapes=[(full, dtype)])
        (total,) = cx.emit("ReduceSum", [sq], attrs, shapes=[(shape, dtype)])
        return cx.emit("Sqrt", [total], shapes=[(shape, dtype)])[0]
    if order not in (1, np.inf):
        raise ConvertError(f"vector norm of order {order} (only 1, 2 and inf)")
    (magnitude,) = cx.emit("Abs", [x], shapes=[(full, dtype)])
    return cx.emit("ReduceSum" if order == 1 else "ReduceMax", [magnitude], attrs, shapes=[(shape, dtype)])[0]


def _arg_extreme(op: str) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """argmax / argmin along `dim` (the first index holding the extreme, as PyTorch), over everything flattened
        where there is no dim."""
        shape, _ = single(shapes)
        x = cx.tensor(args[0])
        sizes, dtype = cx.value(x).shape, cx.value(x).dtype
        dim, keepdim = arg(args, kwargs, 1, "dim"), bool(arg(args, kwargs, 2, "keepdim", False))
        if dim is None:
            sizes, dim, keepdim = (int(np.prod(sizes)),), 0, False
            (x,) = cx.emit("Reshape", [x], shapes=[(sizes, dtype)])
        axis = int(dim) % len(sizes)
        reduced = tuple(1 if d == axis else n for d, n in enumerate(sizes) if keepdim or d != axis)
        attrs = {"axis": int(dim), "keepdims": int(keepdim), "select_last_index": 0}
        (out,) = cx.emit(op, [x], attrs, shapes=[(reduced, "int64")])
        return out if reduced == tuple(shape) else cx.emit("Reshape", [out], shapes=[(shape, "int64")])[0]

    return convert


converts("aten.argmax")(_arg_extreme("ArgMax"))
converts("aten.argmin")(_arg_extreme("ArgMin"))


def _extreme(reduce_op: str, arg_op: str, pairwise: str) -> Converter:
    values, indices, elementwise = _reduce(reduce_op), _arg_extreme(arg_op), binary(pairwise)

    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> Any:
        """max(x): over everything; max(x, dim, keepdim): (values, indices), the index the first holding the
        extreme, as PyTorch; max(x, other): element-wise."""
        if len(shapes) == 2:
            dim, keepdim = arg(args, kwargs, 1, "dim"), arg(args, kwargs, 2, "keepdim", False)
            return (values(cx, (args[0], [dim], keepdim), {}, shapes[:1]),
                    indices(cx, (args[0], dim, keepdim), {}, shapes[1:]))
        if len(args) > 1:
            return elementwise(cx, args[:2], {}, shapes)
        return values(cx, args[:1], {}, shapes)

    return convert


converts("aten.max")(_extreme("ReduceMax", "ArgMax", "Max"))
converts("aten.min")(_extreme("ReduceMin", "ArgMin", "Min"))


def _truth(op: str) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """any / all over `dim` (one, several or everything): the maximum / minimum of the elements' truth as 0 and
        1 (non-zero is true)."""
        shape, _ = single(shapes)
        truth = operand(cx, args[0], "bool")
        full = cx.value(truth).shape
        (ones,) = cx.emit("Cast", [truth], {"to": onnx_type("float32")}, shapes=[(full, "float32")])
        attrs = {"axes": reduce_axes(cx, ones, arg(args, kwargs, 1, "dim")),
                 "keepdims": int(bool(arg(args, kwargs, 2, "keepdim", False))), "noop_with_empty_axes": 0}
        (reduced,) = cx.emit(op, [ones], attrs, shapes=[(shape, "float32")])
        return cx.emit("Cast", [reduced], {"to": onnx_type("bool")}, shapes=[(shape, "bool")])[0]

    return convert


converts("aten.any")(_truth("ReduceMax"))
converts("aten.all")(_truth("ReduceMin"))


@converts("aten.var_mean")
def _var_mean(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple:
    mean = _reduce("ReduceMean")(cx, (args[0], arg(args, kwargs, 1, "dim"), kwargs.get("keepdim", False)), {},
                                 shapes[1:])
    return _var(cx, args, kwargs, shapes[:1]), mean
