"""Lowerings of the reducing ops: N-d MaxPool / AveragePool, GlobalAveragePool, LRN, Softmax, LayerNormalization and
the ONNX Reduce* ops."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tensorgen.graph.ir import Node
from tensorgen.graph.ops.base import FLOATS, Args, broadcast_load, lowering
from tensorgen.te import expr as E
from tensorgen.te.ops import reduce_max, reduce_mean, reduce_min, reduce_prod, reduce_sum, softmax
from tensorgen.te.ops.common import BROADCAST, ELEMWISE, FLOAT_LOWEST, POOL, REDUCE, named, offset, scaled
from tensorgen.te.ops.conv import join_nc, split_nc
from tensorgen.te.ops.math import Prologue
from tensorgen.te.ops.transform import pad
from tensorgen.te.tensor import Tensor, compute, reduce_axis
from tensorgen.te.tensor import max as te_max
from tensorgen.te.tensor import min as te_min
from tensorgen.te.tensor import sum as te_sum


class _Layout:
    """Where a pooling node's channel axis is: second (ONNX) or last (attribute `layout`, set by
    graph.layout.to_channels_last)."""

    def __init__(self, node: Node, nd: int):
        self.last = node.attrs.get("layout") is not None
        self.names = list(self.join("n", "c", [f"o{d}" for d in range(nd)]))

    def spatial(self, seq: Sequence) -> tuple:
        return tuple(self.split(seq)[2])

    def split(self, idx: Sequence) -> tuple:
        """(n, c, spatial) of an index in this layout."""
        return split_nc(idx, self.last)

    def join(self, n, c, sp: Sequence) -> tuple:
        return join_nc(n, c, sp, self.last)


class _Window:
    """The geometry of a pooling node along each spatial dim, from its attributes and output shape."""

    def __init__(self, args: Args, x: Tensor):
        self.nd = x.ndim - 2
        if self.nd < 1:
            raise args.error(f"input {list(x.shape)} has no spatial dimensions")
        self.layout = _Layout(args.node, self.nd)
        self.size = self.layout.spatial(x.shape)
        self.kernel = tuple(args.attr("kernel_shape"))
        self.strides = tuple(args.attr("strides"))
        self.dilations = tuple(args.attr("dilations"))
        pads = tuple(args.attr("pads"))
        self.before, self.after = pads[:self.nd], pads[self.nd:]
        self.out = self.layout.spatial(args.out(0).shape)
        if not len(self.kernel) == len(self.strides) == len(self.dilations) == len(self.out) == self.nd:
            raise args.error(f"kernel_shape, strides, dilations and the output disagree on the {self.nd} "
                             "spatial dims")
        # the window offsets that ever meet the input: the others read only padding, which neither a sum nor a
        # max notices (EfficientNet's pooler is a 2560 x 2560 window, ceil_mode, over a 1 x 1 image: padded to
        # the whole window, its input took 67 GB)
        self.taps = tuple(min(k, (n - 1 + b) // d + 1) for k, d, n, b in zip(
            self.kernel, self.dilations, self.size, self.before))
        # ceil_mode lets the last window reach past the end padding: pad (virtually) up to where it ends
        self.reach = tuple(max(0, (o - 1) * s + (k - 1) * d + 1 - n - b) for o, s, k, d, n, b in zip(
            self.out, self.strides, self.taps, self.dilations, self.size, self.before))

    def padded(self, x: Tensor, value: float, name: str) -> Tensor:
        if not any(self.before) and not any(self.reach):
            return x
        return pad(x, self.layout.join(0, 0, self.before), self.layout.join(0, 0, self.reach), value, name)

    def reduction(self, src: Tensor, combiner, name: str) -> Tensor:
        raxes = [reduce_axis(k, f"r{d}") for d, k in enumerate(self.taps)]

        def body(*idx):
            n, c, sp = self.layout.split(idx)
            pos = [scaled(o, s) + scaled(r, dl) for o, s, r, dl in zip(sp, self.strides, raxes, self.dilations)]
            return combiner(src[self.layout.join(n, c, pos)], axis=raxes)

        n, c, _ = self.layout.split(src.shape)
        attrs = {"kernel": self.taps, "stride": self.strides, "dilation": self.dilations,
                 "padding": (self.before, self.after)}
        return compute(self.layout.join(n, c, self.out), named(body, self.layout.names), name=name, tag=POOL,
                       attrs=attrs)

    def count(self, d: int, o: E.Expr, include_pad: bool) -> int | E.Expr:
        """How many window elements along dim d fall inside the input (plus the explicit padding if
        include_pad), at least 1: a constant where it is the same for every output position. A dilated
        window can lie wholly in the padding; its sum is 0 and so, as in ONNX Runtime, is its average."""
        k, s, dl, b = self.kernel[d], self.strides[d], self.dilations[d], self.before[d]
        lo, hi = (-b, self.size[d] + self.after[d]) if include_pad else (0, self.size[d])
        start = np.arange(self.out[d]) * s - b
        first = -((start - lo) // dl)  # ceil((lo - start) / dl): the first window element inside
        last = -((start - hi) // dl)  # one past the last
        counts = np.minimum(last, k) - np.maximum(first, 0)
        if (counts == counts[0]).all():
            return max(int(counts[0]), 1)

        def ceil_div(e: E.Expr) -> E.Expr:
            return e if dl == 1 else (e + (dl - 1)) // dl

        start_e = offset(scaled(o, s), -b)
        top = ceil_div(hi - start_e)
        top = E.min_expr(top, k) if (last > k).any() else top
        if (first > 0).any():
            bottom = ceil_div(lo - start_e)
            top = top - (E.max_expr(bottom, 0) if (first < 0).any() else bottom)
        return E.max_expr(top, 1) if (counts < 1).any() else top


@lowering("MaxPool", kind="reduce", dtypes=FLOATS)
def _max_pool(node: Node, args: Args) -> list[Tensor]:
    if len([o for o in node.outputs if o]) != 1:
        raise args.error("the Indices output is not supported")
    x = args.tensor(0)
    win = _Window(args, x)
    src = win.padded(x, FLOAT_LOWEST[x.dtype], args.name("pad"))
    return [win.reduction(src, te_max, args.name())]


@lowering("AveragePool", kind="reduce", dtypes=FLOATS)
def _avg_pool(node: Node, args: Args) -> list[Tensor]:
    """A window-sum stage, then the division by the number of elements each window covers."""
    x = args.tensor(0)
    win = _Window(args, x)
    include_pad = bool(args.attr("count_include_pad"))
    total = win.reduction(win.padded(x, 0.0, args.name("pad")), te_sum, args.name("sum"))

    def average(*idx):
        counts = [win.count(d, o, include_pad) for d, o in enumerate(win.layout.split(idx)[2])]
        fixed = math.prod(v for v in counts if isinstance(v, int))
        varying = [v for v in counts if not isinstance(v, int)]
        value = total[idx] * (1.0 / fixed)
        if not varying:
            return value
        divisor = varying[0]
        for v in varying[1:]:
            divisor = divisor * v
        return value / E.cast(divisor, x.dtype)

    return [compute(total.shape, named(average, win.layout.names), name=args.name(), tag=BROADCAST)]


@lowering("GlobalAveragePool", "GlobalMaxPool", kind="reduce", dtypes=FLOATS)
def _global_pool(node: Node, args: Args) -> list[Tensor]:
    x = args.tensor(0)
    if x.ndim < 3:
        raise args.error(f"input {list(x.shape)} has no spatial dimensions")
    nd = x.ndim - 2
    layout = _Layout(node, nd)
    n, c, size = layout.split(x.shape)
    args.expect_shape(0, layout.join(n, c, (1,) * nd))
    raxes = [reduce_axis(k, f"r{d}") for d, k in enumerate(size)]
    scale = 1.0 / math.prod(size)

    def body(*idx):
        n, c, _ = layout.split(idx)
        window = x[layout.join(n, c, raxes)]
        return te_max(window, axis=raxes) if node.op == "GlobalMaxPool" else te_sum(window * scale, axis=raxes)

    return [compute(args.out_shape(), named(body, layout.names), name=args.name(), tag=POOL)]


@lowering("LRN", kind="reduce", dtypes=FLOATS)
def _lrn(node: Node, args: Args) -> list[Tensor]:
    """x / (bias + alpha / size * sum of x^2 over a window of `size` channels) ^ beta, the window from
    floor((size - 1) / 2) channels before to ceil((size - 1) / 2) after (zeros beyond the ends): a windowed sum of
    squares over the zero-padded channel axis (the last one with attribute `layout`, set by graph.layout), then
    the division."""
    x = args.tensor(0)
    if x.ndim < 2:
        raise args.error(f"input {list(x.shape)} has no channel axis")
    size, alpha, beta, bias = (int(args.attr("size")), float(args.attr("alpha")), float(args.attr("beta")),
                               float(args.attr("bias")))
    axis = x.ndim - 1 if node.attrs.get("layout") is not None else 1
    before = [0] * x.ndim
    after = [0] * x.ndim
    before[axis], after[axis] = (size - 1) // 2, size // 2
    src = pad(x, before, after, 0.0, args.name("pad")) if size > 1 else x
    k = reduce_axis(size, "k")

    def window(*idx):
        v = src[(*idx[:axis], idx[axis] + k, *idx[axis + 1:])]
        return te_sum(v * v, axis=k)

    total = compute(x.shape, window, name=args.name("sum"), tag=REDUCE)
    scale = alpha / size
    return [compute(x.shape, lambda *idx: x[idx] / E.power(total[idx] * scale + bias, beta), name=args.name(),
                    tag=ELEMWISE)]


@lowering("Softmax", "LogSoftmax", kind="reduce", dtypes=FLOATS)
def _softmax(node: Node, args: Args) -> list[Tensor]:
    return [softmax(args.tensor(0), int(args.attr("axis")), name=args.name(),
                    log_softmax=node.op == "LogSoftmax")]


REDUCTIONS = {"ReduceSum": reduce_sum, "ReduceMean": reduce_mean, "ReduceMax": reduce_max, "ReduceMin": reduce_min,
              "ReduceProd": reduce_prod}
#: the sums of a function of each element (ReduceL2 then takes the square root)
SUM_PROLOGUES: dict[str, Prologue] = {"ReduceSumSquare": lambda v, at: v * v, "ReduceL1": lambda v, at: E.absolute(v),
                                      "ReduceL2": lambda v, at: v * v}


@lowering("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1", kind="reduce")
@lowering("ReduceMean", "ReduceL2", "ReduceLogSumExp", kind="reduce", dtypes=FLOATS)
def _reduce(node: Node, args: Args) -> list[Tensor]:
    x = args.tensor(0)
    axes, keepdims = tuple(args.attr("axes")) or tuple(range(x.ndim)), bool(args.attr("keepdims"))
    if node.op in REDUCTIONS:
        return [REDUCTIONS[node.op](x, axes, keepdims, name=args.name())]
    if node.op == "ReduceLogSumExp":
        return [_log_sum_exp(args, x, axes, keepdims)]
    root = node.op == "ReduceL2"
    total = reduce_sum(x, axes, keepdims, name=args.name("sum") if root else args.name(),
                       prologue=SUM_PROLOGUES[node.op])
    if not root:
        return [total]
    return [compute(total.shape, lambda *idx: E.sqrt(total[idx]), name=args.name(), tag=ELEMWISE)]


def kept_index(idx: Sequence[E.Expr], axes: Sequence[int], rank: int, keepdims: bool) -> tuple:
    """Where a keepdims reduction over `axes` of a rank-`rank` tensor is read for index `idx` of the same reduction
    with or without keepdims (0 on the reduced axes)."""
    if keepdims:
        return tuple(idx)
    rest = iter(idx)
    return tuple(0 if d in axes else next(rest) for d in range(rank))


def _log_sum_exp(args: Args, x: Tensor, axes: Sequence[int], keepdims: bool) -> Tensor:
    """log(sum(exp(x - m))) + m with m the maximum, so exp never overflows; a non-finite maximum (every element
    -inf, or some +inf) shifts by 0 instead, which gives -inf (+inf) rather than NaN."""
    top = reduce_max(x, axes, True, name=args.name("max"))
    finite = -FLOAT_LOWEST[x.dtype]

    def shift(at: tuple) -> E.Expr:
        m = top[at]
        return E.select(E.absolute(m) <= finite, m, E.const(0.0, x.dtype))

    def shifted_exp(value: E.Expr, at: tuple) -> E.Expr:
        return E.exp(value - shift(tuple(0 if d in axes else i for d, i in enumerate(at))))

    total = reduce_sum(x, axes, keepdims, name=args.name("sum"), prologue=shifted_exp)
    return compute(total.shape, lambda *idx: E.log(total[idx]) + shift(kept_index(idx, axes, x.ndim, keepdims)),
                   name=args.name(), tag=BROADCAST)


@lowering("ArgMax", "ArgMin", kind="reduce", dtypes=("int64",))
def _arg_extreme(node: Node, args: Args) -> list[Tensor]:
    """The index of the largest (ArgMax) or smallest element along `axis`, the first one holding it (the last with
    select_last_index): the extreme, then the least (greatest) index holding it. A NaN is the extreme, as in NumPy
    and PyTorch: the reduction propagates it and the index search matches it."""
    x = args.tensor(0)
    axis, keepdims, last = int(args.attr("axis")), bool(args.attr("keepdims")), bool(args.attr("select_last_index"))
    n = x.shape[axis]
    extreme = (reduce_max if node.op == "ArgMax" else reduce_min)(x, axis, True, name=args.name("extreme"))
    k = reduce_axis(n, "k")

    def body(*idx):
        idx = idx[:len(args.out(0).shape)]  # a 0-d output's te shape is (1,)
        full = list(idx) if keepdims else [*idx[:axis], 0, *idx[axis:]]
        value, best = x[(*full[:axis], k, *full[axis + 1:])], extreme[(*full[:axis], 0, *full[axis + 1:])]
        hit = E.any_of(E.eq(value, best), E.all_of(E.ne(value, value), E.ne(best, best)))
        if last:
            return te_max(E.select(hit, E.cast(k, "int64"), E.const(-1, "int64")), axis=k)
        return te_min(E.select(hit, E.cast(k, "int64"), E.const(n, "int64")), axis=k)

    return [compute(args.out_shape(), body, name=args.name(), tag=REDUCE)]


@lowering("LayerNormalization", "InstanceNormalization", kind="reduce", dtypes=FLOATS)
def _layer_norm(node: Node, args: Args) -> list[Tensor | None]:
    """Normalize over dims axis..end (InstanceNormalization: the spatial ones): mean and variance stages (two
    passes), the inverse standard deviation, then `(x - mean) * inv_std * scale + bias` with scale/bias broadcast
    over those dims (InstanceNormalization: one per channel). The optional Mean and InvStdDev outputs are the
    statistics stages themselves."""
    x = args.tensor(0)
    instance = node.op == "InstanceNormalization"
    axis, eps = 2 if instance else int(args.attr("axis")), float(args.attr("epsilon"))
    if x.ndim <= axis:
        raise args.error(f"input {list(x.shape)} has nothing to normalize over from axis {axis}")
    rank = x.ndim
    inner = x.shape[axis:]
    inv = 1.0 / math.prod(inner)
    stat_shape = x.shape[:axis] + (1,) * (rank - axis)

    def rows(idx: Sequence[E.Expr], axes: Sequence[E.Var]) -> tuple:
        return (*idx[:axis], *axes)

    def stat(idx: Sequence[E.Expr]) -> tuple:
        return (*idx[:axis], *(0,) * (rank - axis))

    k1 = [reduce_axis(n, f"k{d}") for d, n in enumerate(inner)]
    mean = compute(stat_shape, lambda *idx: te_sum(x[rows(idx, k1)] * inv, axis=k1), name=args.name("mean"),
                   tag=REDUCE)
    k2 = [reduce_axis(n, f"k{d}") for d, n in enumerate(inner)]

    def variance(*idx):
        dev = x[rows(idx, k2)] - mean[idx]
        return te_sum(dev * dev * inv, axis=k2)

    var = compute(stat_shape, variance, name=args.name("var"), tag=REDUCE)
    inv_std = compute(stat_shape, lambda *idx: E.rsqrt(var[idx] + eps), name=args.name("inv_std"), tag=ELEMWISE)
    scale = args.tensor(1) if args.present(1) else None
    bias = args.tensor(2) if args.present(2) else None

    def affine(t: Tensor, idx: Sequence[E.Expr]) -> E.Expr:
        return t[(idx[1],)] if instance else broadcast_load(t, idx)

    def body(*idx):
        y = (x[idx] - mean[stat(idx)]) * inv_std[stat(idx)]
        if scale is not None:
            y = y * affine(scale, idx)
        if bias is not None:
            y = y + affine(bias, idx)
        return y

    y = compute(x.shape, body, name=args.name(), tag=BROADCAST, attrs={"axis": axis, "epsilon": eps})
    return [t if name else None for t, name in zip((y, mean, inv_std), node.outputs)]
