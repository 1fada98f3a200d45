"""Converters of less common ATen functions, each a short formula of IR ops: hypot, copysign, signbit, erfinv
(Giles' single-precision approximation), addmv, bucketize and searchsorted (a count of boundaries), cdist,
adaptive pooling (MaxPool / AveragePool, or a Gather of each output cell's window and a ReduceMax / ReduceSum),
and median and kthvalue (a TopK ascending sort, then one position of it)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tensorgen.graph.frontend.torch_ops.core import (
    ConvertError,
    Emitter,
    Formula,
    Shape,
    arg,
    converts,
    onnx_type,
    operand,
    single,
)

INDEX = "int64"



def _axes(cx: Emitter, *axes: int) -> str:
    return cx.constant(np.array(axes, dtype=np.int64), "axes")


def _unsqueeze(f: Formula, x: str, axis: int) -> str:
    """`x` with a unit dim inserted at `axis` (negative: counted from the end of the result)."""
    shape = list(f.cx.value(x).shape)
    axis %= len(shape) + 1
    shape.insert(axis, 1)
    return f("Unsqueeze", x, _axes(f.cx, axis), shape=tuple(shape), out=f.cx.value(x).dtype)



def _sign_bit(f: Formula, x: str) -> str:
    """Whether x is negative, -0.0 included (1 / -0.0 is -inf). A NaN counts as positive (its sign bit is not
    visible to IR ops; PyTorch's NaNs are positive unless negated)."""
    zero = f.const(0)
    if not f.cx.value(x).dtype.startswith("float"):
        return f("Less", x, zero, out="bool")
    negative_zero = f("And", f("Equal", x, zero, out="bool"),
                      f("Less", f("Div", f.const(1), x), zero, out="bool"), out="bool")
    return f("Or", f("Less", x, zero, out="bool"), negative_zero, out="bool")


@converts("aten.signbit")
def _signbit(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    dtype = cx.value(cx.tensor(args[0])).dtype
    f = Formula(cx, dtype)
    return _sign_bit(f, operand(cx, args[0], dtype))


@converts("aten.copysign")
def _copysign(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """|a| with the sign bit of b (-0.0 is negative); negated by a product with -1, as the IR's Neg (0 - x) gives
    +0.0 for 0.0."""
    f = Formula.of(cx, shapes)
    a, b = operand(cx, args[0], f.dtype), operand(cx, args[1], f.dtype)
    magnitude = f("Abs", a)
    shape = single(shapes)[0]
    return f("Where", _sign_bit(f, b), f("Mul", magnitude, f.const(-1)), magnitude, shape=shape)


@converts("aten.hypot")
def _hypot(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """sqrt(a^2 + b^2) without overflow: big * sqrt(1 + (small / big)^2) with big, small = max, min of |a|, |b|;
    0 where both are 0, inf where either is infinite (even with a NaN, as C's hypot)."""
    f = Formula.of(cx, shapes)
    a, b = f("Abs", operand(cx, args[0], f.dtype)), f("Abs", operand(cx, args[1], f.dtype))
    big, small = f("Max", a, b), f("Min", a, b)
    ratio = f("Div", small, big)
    scaled = f("Mul", big, f("Sqrt", f("Add", f.const(1), f("Mul", ratio, ratio))))
    inf = f.const(math.inf)
    infinite = f("Or", f("Equal", a, inf, out="bool"), f("Equal", b, inf, out="bool"), out="bool")
    return f("Where", infinite, inf, f("Where", f("Equal", big, f.const(0), out="bool"), f.const(0), scaled))


#: Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision: w < 5, then w >= 5
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                   -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                0.00943887047, 1.00167406, 2.83297682)


def _horner(f: Formula, w: str, coefficients: tuple[float, ...]) -> str:
    p = f.const(coefficients[0])
    for c in coefficients[1:]:
        p = f("Add", f("Mul", p, w), f.const(c))
    return p


@converts("aten.erfinv")
def _erfinv(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """Giles' approximation in w = -log((1 - x)(1 + x)), then Newton steps on erf(y) = x (one for float32, two for
    float64, which brings it to float64's precision); ±inf at ±1, NaN beyond."""
    f = Formula.of(cx, shapes)
    if not f.dtype.startswith("float"):
        raise ConvertError(f"erfinv to {f.dtype} is not supported")
    x = operand(cx, args[0], f.dtype)
    one = f.const(1)
    w = f("Neg", f("Log", f("Mul", f("Sub", one, x), f("Add", one, x))))
    central = _horner(f, f("Sub", w, f.const(2.5)), _ERFINV_CENTRAL)
    tail = _horner(f, f("Sub", f("Sqrt", w), f.const(3)), _ERFINV_TAIL)
    y = f("Mul", f("Where", f("Less", w, f.const(5), out="bool"), central, tail), x)
    for _ in range(1 if f.dtype == "float32" else 2):
        slope = f("Mul", f("Exp", f("Neg", f("Mul", y, y))), f.const(2 / math.sqrt(math.pi)))
        y = f("Sub", y, f("Div", f("Sub", f("Erf", y), x), slope))
    return f("Where", f("Equal", f("Abs", x), one, out="bool"), f("Mul", x, f.const(math.inf)), y)


@converts("aten.addmv")
def _addmv(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """beta * self + alpha * (mat @ vec); self is not read where beta is 0 (its NaNs do not reach the result)."""
    f = Formula.of(cx, shapes)
    beta, alpha = arg(args, kwargs, 3, "beta", 1), arg(args, kwargs, 4, "alpha", 1)
    product = f("MatMul", operand(cx, args[1], f.dtype), operand(cx, args[2], f.dtype), shape=single(shapes)[0])
    if alpha != 1:
        product = f("Mul", product, f.const(alpha))
    if beta == 0:
        return product
    bias = operand(cx, args[0], f.dtype)
    if beta != 1:
        bias = f("Mul", bias, f.const(beta))
    return f("Add", bias, product)


def _count_below(cx: Emitter, values: Any, boundaries: Any, right: bool, shapes: list[Shape], batched: bool) -> str:
    """How many boundaries lie below each value (at or below it where right), as a binary search over sorted
    boundaries finds: NaN values count every boundary. `batched`: boundaries (..., M) hold one sequence per row
    of values (..., K); else boundaries is 1-D (M,) for every value."""
    shape, out = single(shapes)
    vdtype = cx.value(cx.tensor(values)).dtype if cx.is_runtime(values) else None
    bdtype = cx.value(cx.tensor(boundaries)).dtype if cx.is_runtime(boundaries) else None
    dtype = np.result_type(*(np.dtype(d) for d in (vdtype, bdtype) if d)).name
    f = Formula(cx, dtype)
    v, b = operand(cx, values, dtype), operand(cx, boundaries, dtype)
    if len(cx.value(b).shape) > 1 and not batched:
        raise ConvertError(f"boundaries of shape {list(cx.value(b).shape)} are not 1-D")
    column = _unsqueeze(f, v, -1)  # (..., K, 1)
    row = _unsqueeze(f, b, -2) if batched else b  # (..., 1, M) or (M,)
    beyond = f("Not", f("Less" if right else "LessOrEqual", column, row, out="bool"), out="bool")
    return f.reduce("ReduceSum", f("Cast", beyond, out=out, to=onnx_type(out)), -1, out=out)


def _right(args: tuple, kwargs: dict, at: int) -> bool:
    side = kwargs.get("side")
    if kwargs.get("sorter") is not None:
        raise ConvertError("a sorter is not supported (sort the sequence first)")
    if side not in (None, "left", "right"):
        raise ConvertError(f"side={side!r} is not 'left' or 'right'")
    return bool(arg(args, kwargs, at, "right", False)) or side == "right"


@converts("aten.bucketize")
def _bucketize(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """bucketize(input, boundaries, *, out_int32, right): boundaries 1-D and sorted."""
    return _count_below(cx, args[0], args[1], bool(kwargs.get("right", False)), shapes, batched=False)


@converts("aten.searchsorted")
def _searchsorted(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """searchsorted(sorted_sequence, values, *, out_int32, right, side, sorter): a 1-D sequence for all values, or
    one per row of values."""
    sequence = cx.value(cx.tensor(args[0])).shape if cx.is_runtime(args[0]) else np.shape(args[0])
    values = cx.value(cx.tensor(args[1])).shape if cx.is_runtime(args[1]) else np.shape(args[1])
    batched = len(sequence) > 1
    if batched and (len(values) != len(sequence) or tuple(values[:-1]) != tuple(sequence[:-1])):
        raise ConvertError(f"sorted_sequence {list(sequence)} and values {list(values)} differ in leading dims")
    return _count_below(cx, args[1], args[0], _right(args, kwargs, 3), shapes, batched=batched)


@converts("aten._cdist_forward")
def _cdist(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """_cdist_forward(x1 (.., P, M), x2 (.., R, M), p, compute_mode): the p-norm of every difference x1[i] - x2[j]
    (computed directly for every compute_mode, so as exact as PyTorch's own direct path): p = 0 counts non-zero
    differences, 1 sums |d|, 2 is sqrt(sum d^2), inf is max |d|, other p > 0 are (sum |d|^p)^(1/p)."""
    f = Formula.of(cx, shapes)
    p = float(arg(args, kwargs, 2, "p", 2.0))
    if p < 0 or math.isnan(p):
        raise ConvertError(f"p={p} is not supported (p >= 0)")
    a, b = operand(cx, args[0], f.dtype), operand(cx, args[1], f.dtype)
    diff = f("Abs", f("Sub", _unsqueeze(f, a, -2), _unsqueeze(f, b, -3)))
    if p == math.inf:
        return f.reduce("ReduceMax", diff, -1)
    if p == 0:
        return f.reduce("ReduceSum", f("Cast", f("Not", f("Equal", diff, f.const(0), out="bool"), out="bool"),
                                         to=onnx_type(f.dtype)), -1)
    if p == 1:
        return f.reduce("ReduceSum", diff, -1)
    if p == 2:
        return f("Sqrt", f.reduce("ReduceSum", f("Mul", diff, diff), -1))
    total = f.reduce("ReduceSum", f("Pow", diff, f.const(p)), -1)
    return f("Pow", total, f.const(1 / p))


def _adaptive_windows(n: int, m: int, pad: int | None = None) -> np.ndarray:
    """(m, K) indices of each output cell's window [floor(i n / m), ceil((i + 1) n / m)) along an axis of n, the
    shorter windows padded with index `pad`, or with their last index (max is unchanged by a repeat)."""
    starts = [i * n // m for i in range(m)]
    ends = [-(-(i + 1) * n // m) for i in range(m)]
    width = max(e - s for s, e in zip(starts, ends))
    return np.array([[s + t if s + t < e else e - 1 if pad is None else pad for t in range(width)]
                     for s, e in zip(starts, ends)], dtype=np.int64)


def _pooled_axes(cx: Emitter, args: tuple, shape: tuple[int, ...], op: str,
                 dtype: str) -> tuple[str, int, tuple[int, ...] | None]:
    """An adaptive pool's input, its first pooled axis, and the window (in / out) where the output size divides the
    input's, else None."""
    x = operand(cx, args[0], dtype)
    size = cx.value(x).shape
    first = len(size) - len(args[1])
    if first not in (1, 2):
        raise ConvertError(f"{op} of a {len(size)}-d input to {len(args[1])} pooled axes")
    if first != 2 or any(i % o for i, o in zip(size[first:], shape[first:])):
        return x, first, None
    return x, first, tuple(i // o for i, o in zip(size[first:], shape[first:]))


@converts("aten._adaptive_avg_pool2d", "aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool3d")
def _adaptive_avg_pool(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """GlobalAveragePool, or AveragePool with windows of in / out where the output size divides the input's; else
    per pooled axis a Gather of every cell's window from the axis with a zero appended (the shorter windows' slots
    read it), a ReduceSum and a division by each window's length (UperNet's pyramid pools 1 x 1 to 2 x 2 and 6 x 6)."""
    shape, dtype = single(shapes)
    f = Formula(cx, dtype)
    x, first, kernel = _pooled_axes(cx, args, shape, "adaptive average pooling", dtype)
    size = cx.value(x).shape
    k = len(size) - first
    if kernel is not None and all(o == 1 for o in shape[first:]):
        return f("GlobalAveragePool", x, shape=shape)
    if kernel is not None:
        return f("AveragePool", x, shape=shape, kernel_shape=kernel, strides=kernel, pads=(0,) * (2 * k),
                 auto_pad="NOTSET", ceil_mode=0, count_include_pad=0)
    for axis in range(first, len(size)):
        current, n, m = cx.value(x).shape, size[axis], shape[axis]
        pads = np.zeros(2 * len(current), np.int64)
        pads[len(current) + axis] = 1
        padded = f("Pad", x, cx.constant(pads, "pads"), cx.constant(np.zeros((), dtype)), mode="constant",
                   shape=tuple(d + (a == axis) for a, d in enumerate(current)))
        table = _adaptive_windows(n, m, pad=n)
        gathered = f("Gather", padded, cx.constant(table, "windows"), axis=axis,
                     shape=(*current[:axis], *table.shape, *current[axis + 1:]))
        lengths = (table < n).sum(axis=1).astype(dtype).reshape([m] + [1] * (len(current) - axis - 1))
        x = f("Div", f.reduce("ReduceSum", gathered, axis + 1), cx.constant(lengths, "lengths"))
    return x


@converts("aten.adaptive_max_pool2d", "aten.adaptive_max_pool3d")
def _adaptive_max_pool(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> Any:
    """MaxPool with windows of in / out where the output size divides the input's; else one Gather of every
    cell's window and a ReduceMax per pooled axis (max is separable). The indices output must be unused."""
    shape, dtype = shapes[0]
    f = Formula(cx, dtype)
    x, first, kernel = _pooled_axes(cx, args, shape, "adaptive max pooling", dtype)
    size = cx.value(x).shape
    k = len(size) - first
    if kernel is not None:
        x = f("MaxPool", x, shape=shape, kernel_shape=kernel, strides=kernel, pads=(0,) * (2 * k), auto_pad="NOTSET",
              dilations=(1,) * k, ceil_mode=0, storage_order=0)
    else:
        for axis in range(first, len(size)):
            table = _adaptive_windows(size[axis], shape[axis])
            current = cx.value(x).shape
            gathered = f("Gather", x, cx.constant(table, "windows"), axis=axis,
                         shape=(*current[:axis], *table.shape, *current[axis + 1:]))
            x = f.reduce("ReduceMax", gathered, axis + 1)
    return (x, *(None,) * (len(shapes) - 1)) if len(shapes) > 1 else x


def _order_statistic(cx: Emitter, name: str, dim: int, position: int, keepdim: bool, nan_first: bool,
                     shapes: list[Shape]) -> tuple[str, str]:
    """Element `position` (0-based) of an ascending sort along `dim` and its index; with `nan_first`, a row holding
    a NaN gives NaN and the index of its first NaN (median's NaN propagation)."""
    value = cx.value(name)
    sizes, dtype = value.shape or (1,), value.dtype
    if value.dtype == "bool":
        raise ConvertError("bool tensors are not supported")
    axis = int(dim) % len(sizes)
    f = Formula(cx, dtype)
    if not value.shape:
        name = f("Reshape", name, cx.constant(np.array([1], np.int64)), shape=(1,))
    if not 0 <= position < sizes[axis]:
        raise ConvertError(f"k={position + 1} is out of range for a dim of size {sizes[axis]}")
    k = position + 1
    sorted_shape = tuple(k if d == axis else n for d, n in enumerate(sizes))
    values, indices = cx.emit("TopK", [name, cx.constant(np.array([k], dtype=np.int64), "topk_k")],
                              {"axis": axis, "largest": 0, "sorted": 1}, shapes=[(sorted_shape, dtype),
                                                                                 (sorted_shape, INDEX)])
    at = cx.constant(np.array([position], np.int64), "position")
    picked_shape = tuple(1 if d == axis else n for d, n in enumerate(sizes))
    value_out = f("Gather", values, at, axis=axis, shape=picked_shape)
    index_out = f("Gather", indices, at, axis=axis, shape=picked_shape, out=INDEX)
    if nan_first and dtype.startswith("float"):
        is_nan = f("Cast", f("IsNaN", name, out="bool"), to=onnx_type("int32"), out="int32")
        first_nan = f("ArgMax", is_nan, axis=axis, keepdims=1, select_last_index=0, shape=picked_shape, out=INDEX)
        any_nan = f("Greater", f.reduce("ReduceMax", is_nan, axis, keepdims=True, out="int32"),
                    cx.constant(np.array(0, np.int32)), out="bool")
        value_out = f("Where", any_nan, f.const(math.nan), value_out)
        index_out = f("Where", any_nan, first_nan, index_out, out=INDEX)
    shape = shapes[0][0]
    if not keepdim or not value.shape:
        target = cx.constant(np.array(shape, np.int64), "shape")
        value_out = f("Reshape", value_out, target, shape=shape)
        index_out = f("Reshape", index_out, target, shape=shape, out=INDEX)
    return value_out, index_out


@converts("aten.median")
def _median(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> Any:
    """median(x) (of all elements: values only) and median.dim(x, dim, keepdim) (values and indices): element
    (n - 1) // 2 of an ascending sort, as PyTorch's lower median; NaN where the row holds one."""
    name = cx.tensor(args[0])
    if len(shapes) == 1:
        size = int(np.prod(cx.value(name).shape))
        flat = cx.emit("Reshape", [name, cx.constant(np.array([size], np.int64))],
                       shapes=[((size,), cx.value(name).dtype)])[0]
        return _order_statistic(cx, flat, 0, (size - 1) // 2, False, True,
                                [shapes[0], (shapes[0][0], INDEX)])[0]
    dim = arg(args, kwargs, 1, "dim")
    size = (cx.value(name).shape or (1,))[int(dim) % max(len(cx.value(name).shape), 1)]
    return _order_statistic(cx, name, dim, (size - 1) // 2, bool(arg(args, kwargs, 2, "keepdim", False)), True,
                            shapes)


@converts("aten.kthvalue")
def _kthvalue(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple[str, str]:
    """kthvalue(x, k, dim=-1, keepdim=False): element k - 1 of an ascending sort (NaN sorts last) and its index."""
    return _order_statistic(cx, cx.tensor(args[0]), arg(args, kwargs, 2, "dim", -1), int(args[1]) - 1,
                            bool(arg(args, kwargs, 3, "keepdim", False)), False, shapes)
