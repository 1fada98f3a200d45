"""Lowerings of the scatter ops: ScatterElements and ScatterND, with reduction none, add, mul, max or min.

te has no scatter primitive (a kernel writes each output element once), so a scatter is written from the output's
side: element p of the output is data[p] unless some update targets it, and which updates do is found by comparing
every update's index with p, a reduction over the updates (O(n m) for n outputs and m updates, fine for the sizes
models scatter at: a KV cache's new positions, a few rows of a table).

- reduction add / mul / max / min: out[p] = data[p] (+, *, max, min) the reduction over the updates u of
  select(u targets p, u's value, the reduction's identity).
- reduction none: the last update that targets p wins (ONNX leaves duplicates undefined; ONNX Runtime's CPU kernel
  writes the updates in order, so the last one stays): a max over the updates of select(u targets p, u's flat
  position, -1) finds it, then out[p] = that update's value, or data[p] where none targets p.

Indices are only ever compared, never loaded through: a kernel never reads outside a tensor whatever indices it is
given. Negative indices count from the end of their axis. Run-time indices outside [-n, n) are refused by the
executor before the kernel runs (as it does for Gather), constant ones by the frontend at import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tensorgen.graph.ir import Node
from tensorgen.graph.ops.base import NUMERIC, READABLE, Args, lowering
from tensorgen.te import expr as E
from tensorgen.te.ops.common import INJECTIVE, REDUCE
from tensorgen.te.tensor import Tensor, compute, identity_element, reduce_axis
from tensorgen.te.tensor import max as te_max
from tensorgen.te.tensor import min as te_min
from tensorgen.te.tensor import prod as te_prod
from tensorgen.te.tensor import sum as te_sum

INDEX_DTYPES = ("int32", "int64")
#: reduction attribute -> (te reducer, its combiner name, how the result joins data)
COMBINERS: dict[str, tuple[Callable, str, Callable[[E.Expr, E.Expr], E.Expr]]] = {
    "add": (te_sum, "sum", lambda a, b: a + b),
    "mul": (te_prod, "prod", lambda a, b: a * b),
    "max": (te_max, "max", E.max_expr),
    "min": (te_min, "min", E.min_expr),
}
REDUCTIONS = ("none", *COMBINERS)

Index = Sequence[E.Expr]
#: (output index, update coordinates) -> an expression: whether that update targets the output element, or its value
UpdateFn = Callable[[Index, Index], E.Expr]


def wrapped(i: E.Expr, n: int) -> E.Expr:
    """Index `i` into an axis of size n, negative ones counted from the end."""
    return E.select(i < 0, i + n, i)


def flat_position(coords: Index, extents: Sequence[int]) -> E.Expr:
    """The row-major position of `coords` among `extents`."""
    flat: E.Expr | int = 0
    for c, n in zip(coords, extents):
        flat = flat * n + c
    return E.as_expr(flat, "int32")


def unflatten(flat: E.Expr, extents: Sequence[int]) -> list[E.Expr]:
    """The coordinates of row-major position `flat` among `extents`."""
    coords: list[E.Expr] = []
    for n in reversed(extents):
        coords.append(flat % n)
        flat = flat // n
    return coords[::-1]


def scatter(data: Tensor, extents: Sequence[int], hits: UpdateFn, value: UpdateFn, reduction: str,
            name: str) -> Tensor:
    """data with the updates, of shape `extents`, applied: hits(p, u) says whether update u targets output element
    p and value(p, u) is its value (u's coordinates are in range; p's are output coordinates)."""
    axes = [reduce_axis(n, f"u{d}") for d, n in enumerate(extents)]
    if reduction == "none":
        def last_of(*idx):
            found = E.select(hits(idx, axes), flat_position(axes, extents), E.const(-1, "int32"))
            return te_max(found, axis=axes)

        last = compute(data.shape, last_of, name=f"{name}_last", tag=REDUCE)

        def body(*idx):
            k = last[idx]
            return E.select(k >= 0, value(idx, unflatten(E.max_expr(k, 0), extents)), data[idx])

        return compute(data.shape, body, name=name, tag=INJECTIVE)
    reducer, combiner, join = COMBINERS[reduction]
    identity = identity_element(combiner, data.dtype)

    def reduced(*idx):
        return reducer(E.select(hits(idx, axes), value(idx, axes), identity), axis=axes)

    acc = compute(data.shape, reduced, name=f"{name}_acc", tag=REDUCE)
    return compute(data.shape, lambda *idx: join(data[idx], acc[idx]), name=name, tag=INJECTIVE)


def _reduction(args: Args, dtype: str) -> str:
    reduction = str(args.attr("reduction"))
    if reduction not in REDUCTIONS:
        raise args.error(f"reduction {reduction!r} is not supported ({', '.join(REDUCTIONS)})")
    if reduction != "none" and dtype not in NUMERIC:
        raise args.error(f"reduction {reduction!r} of {dtype} data is not supported ({', '.join(NUMERIC)})")
    return reduction


def _indices(args: Args) -> tuple[Tensor, tuple[int, ...]]:
    if args.value(1).dtype not in INDEX_DTYPES:
        raise args.error(f"indices must be int32 or int64, got {args.value(1).dtype}")
    return args.tensor(1), args.value(1).shape


@lowering("ScatterElements", kind="reduce", dtypes=READABLE)
def _scatter_elements(node: Node, args: Args) -> list[Tensor]:
    """out = data, then out[i..., indices[i..., j, k...], k...] = updates[i..., j, k...] along `axis` (combined
    with the reduction). indices and updates share a shape no larger than data's off the axis."""
    data, shape, axis = args.tensor(0), args.value(0).shape, int(args.attr("axis"))
    reduction = _reduction(args, args.value(0).dtype)
    indices, ishape = _indices(args)
    if args.value(2).shape != ishape or args.value(2).dtype != args.value(0).dtype:
        raise args.error(f"updates {args.value(2).dtype}{list(args.value(2).shape)} must be "
                         f"{args.value(0).dtype}{list(ishape)} (data's type, indices' shape)")
    if len(ishape) != len(shape) or any(m > n for d, (m, n) in enumerate(zip(ishape, shape)) if d != axis):
        raise args.error(f"indices of shape {list(ishape)} do not fit data of shape {list(shape)} off axis {axis}")
    args.expect_shape(0, shape)
    updates, n = args.tensor(2), shape[axis]
    smaller = [d for d, (m, size) in enumerate(zip(ishape, shape)) if d != axis and m < size]

    def at(idx: Index, u: Index) -> tuple:
        """The updates' element at u along the axis and idx off it (clamped into indices' shape)."""
        return tuple(u[0] if d == axis else E.min_expr(i, ishape[d] - 1) if d in smaller else i
                     for d, i in enumerate(idx))

    def hits(idx: Index, u: Index) -> E.Expr:
        inside = [idx[d] < ishape[d] for d in smaller]
        return E.all_of(*inside, E.eq(wrapped(indices[at(idx, u)], n), idx[axis]))

    return [scatter(data, (ishape[axis],), hits, lambda idx, u: updates[at(idx, u)], reduction, args.name())]


@lowering("ScatterND", kind="reduce", dtypes=READABLE)
def _scatter_nd(node: Node, args: Args) -> list[Tensor]:
    """indices of shape (m..., k) name k-coordinate prefixes of data's index; updates (m..., data.shape[k:]) are
    the slices written there: out[indices[m...], rest...] = updates[m..., rest...] (combined with the reduction)."""
    data, shape = args.tensor(0), args.value(0).shape
    reduction = _reduction(args, args.value(0).dtype)
    indices, ishape = _indices(args)
    k, lead = ishape[-1] if ishape else 0, tuple(ishape[:-1])
    if not 1 <= k <= len(shape):
        raise args.error(f"indices of shape {list(ishape)} must end in a dim of 1..{len(shape)} (data's rank)")
    expected = lead + tuple(shape[k:])
    if args.value(2).shape != expected or args.value(2).dtype != args.value(0).dtype:
        raise args.error(f"updates {args.value(2).dtype}{list(args.value(2).shape)} must be "
                         f"{args.value(0).dtype}{list(expected)} (data's type; indices' leading dims, data's last)")
    args.expect_shape(0, shape)
    updates = args.tensor(2)

    def hits(idx: Index, u: Index) -> E.Expr:
        return E.all_of(*(E.eq(wrapped(indices[(*u[:len(lead)], j)], shape[j]), idx[j]) for j in range(k)))

    def value(idx: Index, u: Index) -> E.Expr:
        return updates[(*u[:len(lead)], *idx[k:]) or (0,)]  # a 0-d updates' te shape is (1,)

    return [scatter(data, lead or (1,), hits, value, reduction, args.name())]
