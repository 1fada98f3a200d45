"""Lowerings of the ops that look along one axis at every other element of it: CumSum and TopK.

te has neither a scan nor a sort primitive, so both are written as reductions over a second copy of the axis:
O(n^2) work along it (n the axis' size), which is fine for the sizes models use them at (positions, a few
thousand candidates), keeps every stage an ordinary schedulable compute, and gives exact results.
"""

from __future__ import annotations

from collections.abc import Sequence

from tensorgen.graph.ir import Node
from tensorgen.graph.ops.base import Args, lowering
from tensorgen.te import expr as E
from tensorgen.te.ops.common import INJECTIVE, REDUCE
from tensorgen.te.tensor import Tensor, compute, reduce_axis
from tensorgen.te.tensor import sum as te_sum


def at(idx: Sequence[E.Expr], axis: int, i: E.Expr | int) -> tuple:
    """`idx` with its `axis` entry replaced by `i`."""
    return (*idx[:axis], i, *idx[axis + 1:])


@lowering("CumSum", kind="reduce")
def _cumsum(node: Node, args: Args) -> list[Tensor]:
    """out[i] = sum over k of select(k <= i, x[k], 0) along `axis` (k < i when exclusive; counted from the end
    when reverse): one compute with a reduce axis, O(n^2), and the sum is taken in the order a running sum
    takes it (from the end when reverse), so float results round as a sequential scan does."""
    x = args.tensor(0)
    axis, exclusive, reverse = int(args.attr("axis")), bool(args.attr("exclusive")), bool(args.attr("reverse"))
    n = x.shape[axis]
    k = reduce_axis(n, "k")
    j = (n - 1) - k if reverse else k  # the element the k-th step of the running sum adds

    def body(*idx):
        i = idx[axis]
        if reverse:
            taken = j > i if exclusive else j >= i
        else:
            taken = j < i if exclusive else j <= i
        return te_sum(E.select(taken, x[at(idx, axis, j)], E.const(0, x.dtype)), axis=k)

    return [compute(x.shape, body, name=args.name(), tag=REDUCE)]


def precedes(a: E.Expr, b: E.Expr, ia: E.Expr, ib: E.Expr, largest: bool) -> E.Expr:
    """Whether element a (at index ia) comes before b (at ib) in the order TopK and sort give: by value,
    largest or smallest first, and equal values by index (stable). NaN is the largest value, as in PyTorch's sort
    (first when largest, last when smallest), and NaNs tie with each other."""
    strict = a > b if largest else a < b
    tie = E.eq(a, b)
    if E.is_float(a.dtype):
        nan_a, nan_b = E.ne(a, a), E.ne(b, b)
        first, second = (nan_a, nan_b) if largest else (nan_b, nan_a)
        strict = E.any_of(strict, E.all_of(first, E.logical_not(second)))
        tie = E.any_of(tie, E.all_of(nan_a, nan_b))
    return E.any_of(strict, E.all_of(tie, ia < ib))


def sorted_indices(x: Tensor, axis: int, k: int, largest: bool, name: str) -> Tensor:
    """The int64 indices of the first k elements along `axis` in the order of `precedes`: each element's rank
    (how many elements come before it, O(n^2)), then slot r finds the element whose rank is r (O(k n))."""
    n = x.shape[axis]
    j = reduce_axis(n, "j")

    def rank_of(*idx):
        i = idx[axis]
        before = precedes(x[at(idx, axis, j)], x[idx], j, i, largest)
        return te_sum(E.select(before, E.const(1, "int32"), E.const(0, "int32")), axis=j)

    rank = compute(x.shape, rank_of, name=f"{name}_rank", tag=REDUCE)
    i = reduce_axis(n, "i")

    def index_of(*idx):
        hit = E.eq(rank[at(idx, axis, i)], idx[axis])
        return te_sum(E.select(hit, E.cast(i, "int64"), E.const(0, "int64")), axis=i)

    return compute(at(x.shape, axis, k), index_of, name=name, tag=REDUCE)


def gather_along(x: Tensor, indices: Tensor, axis: int, name: str) -> Tensor:
    """x at `indices` along `axis` (the index clamped into range, so a kernel never reads outside x)."""
    n = x.shape[axis]

    def body(*idx):
        i = E.min_expr(E.max_expr(indices[idx], E.const(0, "int64")), E.const(n - 1, "int64"))
        return x[at(idx, axis, i)]

    return compute(indices.shape, body, name=name, tag=INJECTIVE)


@lowering("TopK", kind="reduce")
def _top_k(node: Node, args: Args) -> list[Tensor | None]:
    """The k largest (smallest) elements along `axis` and their indices, sorted, equal values by index (as the
    ONNX spec asks). No sort primitive: ranks by counting (see sorted_indices), then the values gathered. NaN
    counts as the largest value (PyTorch's order)."""
    x = args.tensor(0)
    axis, k, largest = int(args.attr("axis")), int(args.attr("k")), bool(args.attr("largest"))
    indices = sorted_indices(x, axis, k, largest, args.name("indices"))
    values = gather_along(x, indices, axis, args.name())
    return [t if name else None for t, name in zip((values, indices), node.outputs)]
