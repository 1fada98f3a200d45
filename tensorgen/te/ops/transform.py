"""Injective operators: pad, transpose, reshape, concatenate."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tensorgen.errors import TensorExprError
from tensorgen.te.expr import all_of, const, is_int, select
from tensorgen.te.ops.common import INJECTIVE, check_tensor, normalize_axis, offset
from tensorgen.te.tensor import Tensor, compute


def pad(
    x: Tensor,
    pad_before: Sequence[int],
    pad_after: Sequence[int] | None = None,
    value: float = 0.0,
    name: str = "pad",
) -> Tensor:
    """Constant padding: `pad_before[d]` / `pad_after[d]` elements of `value` around dimension `d`.

    Always its own stage (a `select` on the bounds), even when every amount is zero.
    """
    check_tensor(x, "pad")
    before = tuple(pad_before)
    after = before if pad_after is None else tuple(pad_after)
    for what, amounts in (("pad_before", before), ("pad_after", after)):
        if len(amounts) != x.ndim or any(
            isinstance(a, bool) or not isinstance(a, int) or a < 0 for a in amounts
        ):
            raise TensorExprError(
                f"pad: {what} must hold {x.ndim} non-negative integers (one per dimension of "
                f"{x.name}{list(x.shape)}), got {list(amounts)}"
            )
    if is_int(x.dtype) and isinstance(value, float) and not value.is_integer():
        raise TensorExprError(f"pad: cannot pad the {x.dtype} tensor {x.name} with {value}")
    fill = const(value, x.dtype)
    shape = tuple(b + n + a for b, n, a in zip(before, x.shape, after))

    def body(*idx):
        conds = []
        for i, b, n, a in zip(idx, before, x.shape, after):
            if b > 0:
                conds.append(i >= b)
            if a > 0:
                conds.append(i < b + n)
        inner = x[tuple(offset(i, -b) for i, b in zip(idx, before))]
        return select(all_of(*conds), inner, fill) if conds else inner

    return compute(shape, body, name=name, tag=INJECTIVE, attrs={"pad_before": before, "pad_after": after})


def transpose(x: Tensor, axes: Sequence[int] | None = None, name: str = "transpose") -> Tensor:
    """Permute dimensions: output dimension `d` is input dimension `axes[d]` (reversed if None)."""
    check_tensor(x, "transpose")
    perm = tuple(reversed(range(x.ndim))) if axes is None else tuple(axes)
    if sorted(perm) != list(range(x.ndim)):
        raise TensorExprError(
            f"transpose: axes {list(perm)} is not a permutation of the {x.ndim} dimensions of {x.name}"
        )
    shape = tuple(x.shape[p] for p in perm)

    def body(*idx):
        src = [None] * x.ndim
        for d, p in enumerate(perm):
            src[p] = idx[d]
        return x[tuple(src)]

    return compute(shape, body, name=name, tag=INJECTIVE, attrs={"axes": perm})


def reshape(x: Tensor, shape: Sequence[int], name: str = "reshape") -> Tensor:
    """Row-major reshape; one entry of `shape` may be -1. Indices go through the flat position."""
    check_tensor(x, "reshape")
    new = list(shape)
    if any(isinstance(s, bool) or not isinstance(s, int) or (s <= 0 and s != -1) for s in new):
        raise TensorExprError(f"reshape: shape {new} must hold positive integers (and at most one -1)")
    size = math.prod(x.shape)
    if new.count(-1) > 1:
        raise TensorExprError(f"reshape: shape {new} has more than one -1")
    if -1 in new:
        known = math.prod(s for s in new if s != -1)
        if size % known:
            raise TensorExprError(f"reshape: cannot reshape {x.name}{list(x.shape)} into {new}")
        new[new.index(-1)] = size // known
    if math.prod(new) != size:
        raise TensorExprError(
            f"reshape: {x.name}{list(x.shape)} has {size} elements but shape {new} holds {math.prod(new)}"
        )
    out_strides = _strides(new)
    in_strides = _strides(x.shape)

    def body(*idx):
        flat = None
        for i, n, s in zip(idx, new, out_strides):
            if n == 1:
                continue
            term = i if s == 1 else i * s
            flat = term if flat is None else flat + term
        src = []
        for d, (n, s) in enumerate(zip(x.shape, in_strides)):
            if n == 1 or flat is None:
                src.append(0)
                continue
            e = flat if s == 1 else flat // s
            # the outermost non-trivial dimension needs no modulo: the flat index is in range
            src.append(e if all(m == 1 for m in x.shape[:d]) else e % n)
        return x[tuple(src)]

    return compute(tuple(new), body, name=name, tag=INJECTIVE)


def _strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return strides[::-1]


def concatenate(tensors: Sequence[Tensor], axis: int = 0, name: str = "concatenate") -> Tensor:
    """Join tensors along `axis` (nested selects on the position along that axis)."""
    tensors = list(tensors)
    if not tensors:
        raise TensorExprError("concatenate: needs at least one tensor")
    for k, t in enumerate(tensors):
        check_tensor(t, "concatenate", f"tensor {k}")
    first = tensors[0]
    axis = normalize_axis(axis, first.ndim, "concatenate")
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(
            a != b for d, (a, b) in enumerate(zip(t.shape, first.shape)) if d != axis
        ):
            raise TensorExprError(
                f"concatenate: {t.name}{list(t.shape)} does not match {first.name}{list(first.shape)} "
                f"outside axis {axis}"
            )
        if t.dtype != first.dtype:
            raise TensorExprError(f"concatenate: {t.name} is {t.dtype} but {first.name} is {first.dtype}")
    starts = [0]
    for t in tensors:
        starts.append(starts[-1] + t.shape[axis])
    shape = first.shape[:axis] + (starts[-1],) + first.shape[axis + 1:]

    def body(*idx):
        def part(k):
            i = idx[axis]
            return tensors[k][idx[:axis] + (offset(i, -starts[k]),) + idx[axis + 1:]]

        expr = part(len(tensors) - 1)
        for k in range(len(tensors) - 2, -1, -1):
            expr = select(idx[axis] < starts[k + 1], part(k), expr)
        return expr

    return compute(shape, body, name=name, tag=INJECTIVE, attrs={"axis": axis})
