"""Shared helpers of the operator library: argument checking, tags, index arithmetic."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

from tensorgen.errors import TensorExprError
from tensorgen.te.expr import Const, Expr, ExprLike
from tensorgen.te.tensor import Tensor

# Tags a scheduler can use to recognise the kind of a stage.
ELEMWISE = "elemwise"  # out[i] = f(in[i], ...) with the same shape everywhere
BROADCAST = "broadcast"  # elementwise after NumPy broadcasting of the operands
INJECTIVE = "injective"  # every output element reads a computed position of each input (pad, transpose, ...)
REDUCE = "reduce"  # a plain reduction (softmax max/sum, norms, reduce_* ops)
POOL = "pool"
CONV1D, CONV2D, CONV3D = "conv1d", "conv2d", "conv3d"
CONV2D_TRANSPOSE = "conv2d_transpose"
CONV2D_CAPSULE = "conv2d_capsule"
MATMUL, BATCH_MATMUL, DENSE = "matmul", "batch_matmul", "dense"

# Finite stand-in for -inf, used to pad max pooling (C printers need no special value for it).
FLOAT_LOWEST = {"float16": -65504.0, "float32": -3.4028234663852886e38, "float64": -1.7976931348623157e308}


def check_tensor(x: object, op: str, what: str = "input", ndim: int | Sequence[int] | None = None) -> Tensor:
    if not isinstance(x, Tensor):
        raise TensorExprError(f"{op}: {what} must be a Tensor, got {type(x).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise TensorExprError(
                f"{op}: {what} {x.name} must have {want} dimension(s), got shape {list(x.shape)}"
            )
    return x


def check_same_dtype(op: str, *tensors: Tensor) -> str:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        desc = ", ".join(f"{t.name}: {t.dtype}" for t in tensors)
        raise TensorExprError(f"{op}: operands must share one dtype, got {desc}")
    return tensors[0].dtype


def int_tuple(value: int | Sequence[int], n: int, op: str, what: str, minimum: int = 1) -> tuple[int, ...]:
    """An int or a sequence of `n` ints, each >= `minimum`, as a tuple of length `n`."""
    vals = (value,) * n if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
    if len(vals) != n or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in vals):
        raise TensorExprError(
            f"{op}: {what} must be an integer >= {minimum} or {n} of them, got {value!r}"
        )
    return vals


def padding_pairs(padding: int | Sequence[int], n: int, op: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Padding of `n` spatial dims: an int, `n` ints (symmetric) or `2n` ints (all befores, then afters)."""
    if isinstance(padding, int) and not isinstance(padding, bool):
        vals = (padding,) * n
    else:
        vals = tuple(padding)
    if len(vals) == n:
        vals = vals + vals
    if len(vals) != 2 * n or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in vals):
        raise TensorExprError(
            f"{op}: padding must be a non-negative integer, {n} of them or {2 * n} of them "
            f"(befores then afters), got {padding!r}"
        )
    return vals[:n], vals[n:]


def normalize_axis(axis: int, ndim: int, op: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int) or not -ndim <= axis < ndim:
        raise TensorExprError(f"{op}: axis {axis!r} is out of range for a tensor of {ndim} dimension(s)")
    return axis % ndim


def named(fn: Callable[..., ExprLike], names: Sequence[str]) -> Callable[..., ExprLike]:
    """Give a `*args` function explicit parameter names, so `te.compute` names its axes after them."""
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names]

    def wrapper(*args):
        return fn(*args)

    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return wrapper


def scaled(index: Expr, factor: int) -> Expr:
    """`index * factor`, without a multiplication by 1 (keeps index expressions readable)."""
    return index if factor == 1 else index * factor


def offset(index: ExprLike, delta: int) -> ExprLike:
    if delta == 0:
        return index
    if isinstance(index, Const):
        return index.value + delta
    return index + delta if delta > 0 else index - (-delta)
