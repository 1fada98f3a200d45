"""Converters of the ATen ops that look along one axis: cumsum, topk, sort and argsort (as CumSum and TopK).

They register into torch_ops' table like the converters there; torch_import imports this module.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorgen.graph.frontend.torch_ops import ConvertError, Emitter, Shape, arg, converts, operand

INDEX = "int64"


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
    name = cx.tensor(x)
    value = cx.value(name)
    if not value.shape:
        raise ConvertError("sorting a 0-d tensor is not supported")
    if value.dtype == "bool":
        raise ConvertError("sorting bool tensors is not supported")
    axis = int(dim) % len(value.shape)
    k = value.shape[axis] if k is None else int(k)
    shape = tuple(k if d == axis else n for d, n in enumerate(value.shape))
    attrs = {"axis": axis, "largest": int(largest), "sorted": 1}
    values, indices = cx.emit("TopK", [name, cx.constant(np.array([k], dtype=np.int64), "topk_k")], attrs,
                              shapes=[(shape, value.dtype), (shape, INDEX)])
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
