"""Elementwise, broadcasting and reduction operators."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from tensorgen.errors import TensorExprError
from tensorgen.te import expr as E
from tensorgen.te.ops.common import BROADCAST, ELEMWISE, REDUCE, check_tensor, normalize_axis
from tensorgen.te.tensor import Tensor, compute, reduce_axis
from tensorgen.te.tensor import max as te_max
from tensorgen.te.tensor import min as te_min
from tensorgen.te.tensor import prod as te_prod
from tensorgen.te.tensor import sum as te_sum

Scalar = int | float

# ---------------------------------------------------------------------------------------------
# unary elementwise


def elementwise(x: Tensor, fn: Callable[[E.Expr], E.ExprLike], name: str, tag: str = ELEMWISE) -> Tensor:
    """`out[i] = fn(x[i])` over every element of `x`."""
    check_tensor(x, name)
    return compute(x.shape, lambda *idx: fn(x[idx]), name=name, tag=tag)


def _require_float(x: Tensor, op: str) -> None:
    check_tensor(x, op)
    if not E.is_float(x.dtype):
        raise TensorExprError(f"{op}: needs a floating-point tensor, {x.name} is {x.dtype}")


def relu(x: Tensor, name: str = "relu") -> Tensor:
    return elementwise(x, lambda v: E.max_expr(v, E.const(0, v.dtype)), name)


def relu6(x: Tensor, name: str = "relu6") -> Tensor:
    return clip(x, 0, 6, name=name)


def clip(x: Tensor, a_min: Scalar, a_max: Scalar, name: str = "clip") -> Tensor:
    """Clamp every element into `[a_min, a_max]`."""
    check_tensor(x, "clip")
    if not a_min <= a_max:
        raise TensorExprError(f"clip: a_min {a_min} is greater than a_max {a_max}")
    lo, hi = E.const(a_min, x.dtype), E.const(a_max, x.dtype)
    return elementwise(x, lambda v: E.min_expr(E.max_expr(v, lo), hi), name)


def sigmoid(x: Tensor, name: str = "sigmoid") -> Tensor:
    _require_float(x, "sigmoid")
    return elementwise(x, E.sigmoid, name)


def tanh(x: Tensor, name: str = "tanh") -> Tensor:
    _require_float(x, "tanh")
    return elementwise(x, E.tanh, name)


def gelu(x: Tensor, name: str = "gelu") -> Tensor:
    """Exact GELU: `0.5 * x * (1 + erf(x / sqrt(2)))`."""
    _require_float(x, "gelu")
    return elementwise(x, lambda v: v * 0.5 * (E.erf(v * (1.0 / math.sqrt(2.0))) + 1.0), name)


# ---------------------------------------------------------------------------------------------
# broadcasting binary operators


def broadcast_shape(a: Sequence[int], b: Sequence[int], op: str = "broadcast") -> tuple[int, ...]:
    """NumPy broadcasting of two shapes (right-aligned; each pair equal or one of them 1)."""
    out = []
    for k in range(1, max(len(a), len(b)) + 1):
        da = a[-k] if k <= len(a) else 1
        db = b[-k] if k <= len(b) else 1
        if da != db and 1 not in (da, db):
            raise TensorExprError(f"{op}: shapes {list(a)} and {list(b)} cannot be broadcast together")
        out.append(max(da, db))
    return tuple(reversed(out))


def _broadcast_load(t: Tensor, idx: tuple[E.Expr, ...]) -> E.Expr:
    """`t` read at output index `idx`: leading output axes dropped, size-1 dims read at 0."""
    tail = idx[len(idx) - t.ndim:]
    return t[tuple(0 if n == 1 else i for i, n in zip(tail, t.shape))]


def _binary(a: Tensor | Scalar, b: Tensor | Scalar, fn, op: str, name: str) -> Tensor:
    tensors = [t for t in (a, b) if isinstance(t, Tensor)]
    if not tensors:
        raise TensorExprError(f"{op}: at least one operand must be a Tensor, got {a!r} and {b!r}")
    for v in (a, b):
        if not isinstance(v, Tensor) and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise TensorExprError(f"{op}: operands must be Tensors or Python numbers, got {type(v).__name__}")
    if len(tensors) == 2 and a.dtype != b.dtype:
        raise TensorExprError(f"{op}: {a.name} is {a.dtype} but {b.name} is {b.dtype}; cast one of them")
    shape = tensors[0].shape if len(tensors) == 1 else broadcast_shape(a.shape, b.shape, op)
    tag = BROADCAST if any(t.shape != shape for t in tensors) else ELEMWISE
    dtype = tensors[0].dtype

    def operand(v, idx):
        if isinstance(v, Tensor):
            return _broadcast_load(v, idx)
        return E.const(v, dtype if (E.is_float(dtype) or isinstance(v, int)) else "float32")

    return compute(shape, lambda *idx: fn(operand(a, idx), operand(b, idx)), name=name, tag=tag)


def add(a: Tensor | Scalar, b: Tensor | Scalar, name: str = "add") -> Tensor:
    return _binary(a, b, lambda x, y: x + y, "add", name)


def sub(a: Tensor | Scalar, b: Tensor | Scalar, name: str = "sub") -> Tensor:
    return _binary(a, b, lambda x, y: x - y, "sub", name)


def mul(a: Tensor | Scalar, b: Tensor | Scalar, name: str = "mul") -> Tensor:
    return _binary(a, b, lambda x, y: x * y, "mul", name)


def div(a: Tensor | Scalar, b: Tensor | Scalar, name: str = "div") -> Tensor:
    """True division; integer tensors are rejected (use floor division in a compute instead)."""
    return _binary(a, b, lambda x, y: x / y, "div", name)


def maximum(a: Tensor | Scalar, b: Tensor | Scalar, name: str = "maximum") -> Tensor:
    return _binary(a, b, E.max_expr, "maximum", name)


def minimum(a: Tensor | Scalar, b: Tensor | Scalar, name: str = "minimum") -> Tensor:
    return _binary(a, b, E.min_expr, "minimum", name)


# ---------------------------------------------------------------------------------------------
# reductions

#: what a reduction applies to each element before combining: (value, its index in x) -> new value
Prologue = Callable[[E.Expr, tuple], E.Expr]


def _reduce(
    x: Tensor,
    axis: int | Sequence[int] | None,
    keepdims: bool,
    combiner,
    op: str,
    name: str,
    prologue: Prologue | None = None,
) -> Tensor:
    check_tensor(x, op)
    if axis is None:
        axes = tuple(range(x.ndim))
    else:
        raw = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(sorted(normalize_axis(a, x.ndim, op) for a in raw))
        if len(set(axes)) != len(axes) or not axes:
            raise TensorExprError(f"{op}: axis {axis!r} must name distinct dimensions (at least one)")
    raxes = {d: reduce_axis(x.shape[d], f"k{d}") for d in axes}
    kept = [d for d in range(x.ndim) if d not in raxes]
    if keepdims:
        shape = tuple(1 if d in raxes else n for d, n in enumerate(x.shape))
    else:
        shape = tuple(x.shape[d] for d in kept) or (1,)  # a full reduction gives shape (1,)

    def body(*idx):
        src, pos = [], 0
        for d in range(x.ndim):
            if d in raxes:
                src.append(raxes[d])
                pos += keepdims
            else:
                src.append(idx[pos])
                pos += 1
        value = x[tuple(src)]
        if prologue is not None:
            value = prologue(value, tuple(src))
        return combiner(value, axis=list(raxes.values()))

    return compute(shape, body, name=name, tag=REDUCE, attrs={"axis": axes, "keepdims": keepdims})


def reduce_sum(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False,
               name: str = "reduce_sum", prologue: Prologue | None = None) -> Tensor:
    """Sum over `axis` (all axes if None); reducing every axis without keepdims gives shape (1,). `prologue(value,
    index)` maps each element (read at `index` of x, reduction axes included) before it is summed: |x|, x * x."""
    return _reduce(x, axis, keepdims, te_sum, "reduce_sum", name, prologue)


def reduce_prod(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False,
                name: str = "reduce_prod") -> Tensor:
    """Product over `axis` (all axes if None), starting from 1."""
    return _reduce(x, axis, keepdims, te_prod, "reduce_prod", name)


def reduce_mean(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False,
                name: str = "reduce_mean") -> Tensor:
    """Mean over `axis`, one stage: the sum of `x * (1/count)`."""
    _require_float(x, "reduce_mean")
    axes = range(x.ndim) if axis is None else ((axis,) if isinstance(axis, int) else axis)
    count = math.prod(x.shape[normalize_axis(a, x.ndim, "reduce_mean")] for a in axes)
    scale = 1.0 / count
    return _reduce(x, axis, keepdims, te_sum, "reduce_mean", name, lambda value, index: value * scale)


def reduce_max(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False,
               name: str = "reduce_max") -> Tensor:
    return _reduce(x, axis, keepdims, te_max, "reduce_max", name)


def reduce_min(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False,
               name: str = "reduce_min") -> Tensor:
    return _reduce(x, axis, keepdims, te_min, "reduce_min", name)
