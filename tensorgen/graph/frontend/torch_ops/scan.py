"""Converters of the ATen ops that look along one axis: cumsum, topk, sort and argsort (as CumSum and TopK),
and cummax and cummin (composed of IR ops)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorgen.graph.frontend.torch_ops.core import (
    Converter,
    ConvertError,
    Emitter,
    Formula,
    Shape,
    arg,
    converts,
    operand,
)

INDEX = "int64"


def _values(x: Any, cx: Emitter, what: str) -> tuple[str, tuple[int, ...], str]:
    """A run-time tensor argument that has at least one dim and is not bool: (name, shape, dtype)."""
    name = cx.tensor(x)
    value = cx.value(name)
    if not value.shape:
        raise ConvertError(f"{what} of a 0-d tensor is not supported")
    if value.dtype == "bool":
        raise ConvertError(f"{what} of bool tensors is not supported")
    return name, value.shape, value.dtype


def _axis_const(cx: Emitter, dim: Any, base: str) -> str:
    return cx.constant(np.array([int(dim)], dtype=np.int64), base)


@converts("aten.cumsum")
def _cumsum(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """cumsum(x, dim, dtype=None): CumSum in the output's dtype (bool and integer inputs sum as int64, as
    PyTorch promotes them), the input cast to it first."""
    shape, dtype = shapes[0]
    x = operand(cx, args[0], dtype)
    dim = arg(args, kwargs, 1, "dim")
    attrs = {"exclusive": 0, "reverse": 0}
    return cx.emit("CumSum", [x, _axis_const(cx, dim, "cumsum_axis")], attrs, shapes=[(shape, dtype)])[0]


def _top(cx: Emitter, x: Any, dim: Any, k: int | None, largest: bool, shapes: list[Shape]) -> tuple[str, str]:
    """TopK of `x` along `dim` (all of it where k is None): (values, int64 indices), equal values by index."""
    name, sizes, dtype = _values(x, cx, "sorting")
    axis = int(dim) % len(sizes)
    k = sizes[axis] if k is None else int(k)
    shape = tuple(k if d == axis else n for d, n in enumerate(sizes))
    attrs = {"axis": axis, "largest": int(largest), "sorted": 1}
    values, indices = cx.emit("TopK", [name, cx.constant(np.array([k], dtype=np.int64), "topk_k")], attrs,
                              shapes=[(shape, dtype), (shape, INDEX)])
    return values, indices


@converts("aten.topk")
def _topk(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple[str, str]:
    """topk(x, k, dim=-1, largest=True, sorted=True): always sorted; equal values by index (ascending)."""
    return _top(cx, args[0], arg(args, kwargs, 2, "dim", -1), arg(args, kwargs, 1, "k"),
                bool(arg(args, kwargs, 3, "largest", True)), shapes)


@converts("aten.sort")
def _sort(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple[str, str]:
    """sort(x, dim=-1, descending=False) and sort.stable(x, *, stable, dim, descending): always stable."""
    return _top(cx, args[0], arg(args, kwargs, 1, "dim", -1), None, bool(arg(args, kwargs, 2, "descending", False)),
                shapes)


@converts("aten.argsort")
def _argsort(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """argsort(x, dim=-1, descending=False) (and .stable): the indices of a stable sort."""
    return _sort(cx, args, kwargs, shapes)[1]


def _running_extreme(largest: bool) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple[str, str]:
        """cummax / cummin(x, dim): (values, int64 indices) without a scan op, O(n^2) in time and memory along dim
        (n its size): every prefix x[..k..] for k <= i laid out on a new axis next to dim (the rest filled with
        the dtype's lowest (highest) value), reduced by ReduceMax (ReduceMin); the index is the last k <= i holding
        the prefix's extreme, as PyTorch's running `>=` (`<=`) gives. A NaN is the extreme from where it appears,
        its index the last NaN so far, as in PyTorch."""
        x, sizes, dtype = _values(args[0], cx, "cummax" if largest else "cummin")
        axis = int(arg(args, kwargs, 1, "dim")) % len(sizes)
        n, trailing = sizes[axis], (1,) * (len(sizes) - axis - 1)
        f = Formula(cx, dtype)
        prefix = cx.constant(np.tri(n, dtype=bool).reshape((n, n, *trailing)), "prefix")  # k <= i
        rows = f("Unsqueeze", x, cx.constant(np.array([axis], np.int64)), shape=(*sizes[:axis], 1, *sizes[axis:]))
        masked = f("Where", prefix, rows, cx.constant(_beyond(dtype, largest)))
        reduce = {"axes": [axis + 1], "keepdims": 0, "noop_with_empty_axes": 0}
        values = f("ReduceMax" if largest else "ReduceMin", masked, shape=sizes, **reduce)
        column = f("Unsqueeze", values, cx.constant(np.array([axis + 1], np.int64)),
                   shape=(*sizes[:axis + 1], 1, *sizes[axis + 1:]))
        same = f("Equal", masked, column, out="bool")
        if np.dtype(dtype).kind == "f":  # NaN matches NaN
            nan = [f("Not", f("Equal", t, t, out="bool"), out="bool") for t in (masked, column)]
            same = f("Or", same, f("And", *nan, out="bool"), out="bool")
        hit = f("And", same, prefix, out="bool")
        positions = cx.constant(np.arange(n, dtype=np.int64).reshape((n, *trailing)), "positions")
        where = f("Where", hit, positions, cx.constant(np.array(-1, np.int64)), out=INDEX)
        return values, f("ReduceMax", where, shape=sizes, out=INDEX, **reduce)

    return convert


def _beyond(dtype: str, largest: bool) -> np.ndarray:
    """A value that is never past any element in the order (cummax: -inf, or the integer minimum)."""
    if np.dtype(dtype).kind == "f":
        return np.array(-np.inf if largest else np.inf, dtype)
    info = np.iinfo(dtype)
    return np.array(info.min if largest else info.max, dtype)


converts("aten.cummax")(_running_extreme(largest=True))
converts("aten.cummin")(_running_extreme(largest=False))
