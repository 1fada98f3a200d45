"""Neural-network operators: pooling, softmax, layer norm, batch norm (inference)."""

from __future__ import annotations

from collections.abc import Sequence

from tensorgen.errors import TensorExprError
from tensorgen.te.expr import cast, exp, is_float, log, max_expr, min_expr, rsqrt
from tensorgen.te.ops.common import (
    BROADCAST,
    ELEMWISE,
    FLOAT_LOWEST,
    POOL,
    REDUCE,
    check_same_dtype,
    check_tensor,
    int_tuple,
    named,
    normalize_axis,
    offset,
    padding_pairs,
    scaled,
)
from tensorgen.te.ops.conv import is_channels_last, join_nc, pad_spatial, split_nc
from tensorgen.te.tensor import Tensor, compute, reduce_axis
from tensorgen.te.tensor import max as te_max
from tensorgen.te.tensor import sum as te_sum

IntOrSeq = int | Sequence[int]


def _require_float(x: Tensor, op: str) -> None:
    if not is_float(x.dtype):
        raise TensorExprError(f"{op}: needs a floating-point tensor, {x.name} is {x.dtype}")


def _pool_geometry(x: Tensor, kernel: IntOrSeq, stride: IntOrSeq | None, padding: IntOrSeq, layout: str,
                   op: str):
    check_tensor(x, op, "data", ndim=4)
    cl = is_channels_last(layout, 2, op)
    ks = int_tuple(kernel, 2, op, "kernel")
    strides = ks if stride is None else int_tuple(stride, 2, op, "stride")
    before, after = padding_pairs(padding, 2, op)
    _, _, size = split_nc(x.shape, cl)
    out = []
    for d in range(2):
        if max(before[d], after[d]) >= ks[d]:
            raise TensorExprError(f"{op}: padding {before[d]}/{after[d]} must be smaller than kernel {ks[d]}")
        padded = size[d] + before[d] + after[d]
        if ks[d] > padded:
            raise TensorExprError(
                f"{op}: kernel {list(ks)} is larger than the padded input ({padded}, dim {d})"
            )
        out.append((padded - ks[d]) // strides[d] + 1)
    return cl, ks, strides, before, after, out


def max_pool2d(x: Tensor, kernel: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               layout: str = "NHWC", name: str = "max_pool2d") -> Tensor:
    """2-D max pooling (stride defaults to the kernel); padding reads the lowest finite value."""
    cl, ks, strides, before, after, out = _pool_geometry(x, kernel, stride, padding, layout, "max_pool2d")
    lowest = FLOAT_LOWEST.get(x.dtype, -(2**31))
    src = pad_spatial(x, before, after, cl, name="pool_pad", value=lowest)
    rh, rw = reduce_axis(ks[0], "rh"), reduce_axis(ks[1], "rw")

    def body(*idx):
        n, c, (h, w) = split_nc(idx, cl)
        pos = (scaled(h, strides[0]) + rh, scaled(w, strides[1]) + rw)
        return te_max(src[join_nc(n, c, pos, cl)], axis=[rh, rw])

    attrs = {"layout": layout, "kernel": ks, "stride": strides, "padding": (before, after)}
    return compute(join_nc(x.shape[0], split_nc(x.shape, cl)[1], out, cl), named(body, join_nc("n", "c", "hw", cl)),
                   name=name, tag=POOL, attrs=attrs)


def avg_pool2d(x: Tensor, kernel: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               layout: str = "NHWC", count_include_pad: bool = False, name: str = "avg_pool2d") -> Tensor:
    """2-D average pooling: a `pool_sum` stage, then a division stage.

    With `count_include_pad=False` (the default, as in TVM / ONNX) each window is divided by the number
    of input elements it covers; with True by `kh * kw` (PyTorch's default).
    """
    _require_float(x, "avg_pool2d")
    cl, ks, strides, before, after, out = _pool_geometry(x, kernel, stride, padding, layout, "avg_pool2d")
    src = pad_spatial(x, before, after, cl, name="pool_pad")
    rh, rw = reduce_axis(ks[0], "rh"), reduce_axis(ks[1], "rw")
    _, chans, size = split_nc(x.shape, cl)
    shape = join_nc(x.shape[0], chans, out, cl)
    names = join_nc("n", "c", "hw", cl)

    def total(*idx):
        n, c, (h, w) = split_nc(idx, cl)
        pos = (scaled(h, strides[0]) + rh, scaled(w, strides[1]) + rw)
        return te_sum(src[join_nc(n, c, pos, cl)], axis=[rh, rw])

    pool_sum = compute(shape, named(total, names), name=f"{name}_sum", tag=POOL)
    needs_count = not count_include_pad and (any(before) or any(after))

    def average(*idx):
        _, _, sp = split_nc(idx, cl)
        if not needs_count:
            return pool_sum[idx] * (1.0 / (ks[0] * ks[1]))
        count = None
        for d, i in enumerate(sp):
            start = offset(scaled(i, strides[d]), -before[d])
            lo = max_expr(start, 0) if before[d] else start
            end = offset(scaled(i, strides[d]), ks[d] - before[d])
            hi = min_expr(end, size[d]) if after[d] else end
            extent = hi - lo
            count = extent if count is None else count * extent
        return pool_sum[idx] / cast(count, x.dtype)

    attrs = {"layout": layout, "kernel": ks, "stride": strides, "padding": (before, after),
             "count_include_pad": count_include_pad}
    return compute(shape, named(average, names), name=name, tag=BROADCAST, attrs=attrs)


def global_avg_pool2d(x: Tensor, layout: str = "NHWC", name: str = "global_avg_pool2d") -> Tensor:
    """Mean over H and W, keeping them as size-1 dims: (N, 1, 1, C) or (N, C, 1, 1). One stage."""
    check_tensor(x, "global_avg_pool2d", "data", ndim=4)
    _require_float(x, "global_avg_pool2d")
    cl = is_channels_last(layout, 2, "global_avg_pool2d")
    n, c, (h, w) = split_nc(x.shape, cl)
    rh, rw = reduce_axis(h, "rh"), reduce_axis(w, "rw")
    scale = 1.0 / (h * w)

    def body(*idx):
        i, j, _ = split_nc(idx, cl)
        return te_sum(x[join_nc(i, j, (rh, rw), cl)] * scale, axis=[rh, rw])

    return compute(join_nc(n, c, (1, 1), cl), named(body, join_nc("n", "c", ("h", "w"), cl)), name=name,
                   tag=POOL, attrs={"layout": layout})


def _insert(idx: tuple, axis: int, value) -> tuple:
    return idx[:axis] + (value,) + idx[axis:]


def softmax(x: Tensor, axis: int = -1, name: str = "softmax", log_softmax: bool = False) -> Tensor:
    """Numerically stable softmax: `softmax_max`, `softmax_exp`, `softmax_sum`, then the division stage
    (`log_softmax`: x - max - log(sum) in the last stage)."""
    check_tensor(x, "softmax")
    _require_float(x, "softmax")
    axis = normalize_axis(axis, x.ndim, "softmax")
    outer = x.shape[:axis] + x.shape[axis + 1:] or (1,)
    squeeze = x.ndim > 1
    k1 = reduce_axis(x.shape[axis], "k")
    k2 = reduce_axis(x.shape[axis], "k")

    def red_index(idx, k):
        return _insert(idx, axis, k) if squeeze else (k,)

    def outer_index(idx):
        return idx[:axis] + idx[axis + 1:] if squeeze else (0,)

    mx = compute(outer, lambda *idx: te_max(x[red_index(idx, k1)], axis=k1), name=f"{name}_max", tag=REDUCE)
    ex = compute(x.shape, lambda *idx: exp(x[idx] - mx[outer_index(idx)]), name=f"{name}_exp", tag=BROADCAST)
    sm = compute(outer, lambda *idx: te_sum(ex[red_index(idx, k2)], axis=k2), name=f"{name}_sum", tag=REDUCE)
    if log_softmax:
        return compute(x.shape, lambda *idx: x[idx] - mx[outer_index(idx)] - log(sm[outer_index(idx)]), name=name,
                       tag=BROADCAST, attrs={"axis": axis})
    return compute(x.shape, lambda *idx: ex[idx] / sm[outer_index(idx)], name=name, tag=BROADCAST,
                   attrs={"axis": axis})


def layer_norm(x: Tensor, gamma: Tensor | None = None, beta: Tensor | None = None, epsilon: float = 1e-5,
               name: str = "layer_norm") -> Tensor:
    """Normalise over the last axis: `(x - mean) * rsqrt(var + eps) * gamma + beta` (biased variance).

    Stages: `<name>_mean`, `<name>_var` (two-pass, numerically safe), then the output stage.
    """
    check_tensor(x, "layer_norm")
    _require_float(x, "layer_norm")
    n = x.shape[-1]
    for what, t in (("gamma", gamma), ("beta", beta)):
        if t is not None:
            check_tensor(t, "layer_norm", what, ndim=1)
            check_same_dtype("layer_norm", x, t)
            if t.shape[0] != n:
                raise TensorExprError(f"layer_norm: {what} {t.name}{list(t.shape)} must have shape [{n}]")
    outer = x.shape[:-1] or (1,)
    lead = x.ndim > 1
    k1, k2 = reduce_axis(n, "k"), reduce_axis(n, "k")
    inv = 1.0 / n

    def row(idx, k):
        return (*idx, k) if lead else (k,)

    def stat(idx):
        return idx[:-1] if lead else (0,)

    mean = compute(outer, lambda *idx: te_sum(x[row(idx, k1)] * inv, axis=k1), name=f"{name}_mean",
                   tag=REDUCE)

    def variance(*idx):
        d = x[row(idx, k2)] - mean[idx]
        return te_sum(d * d * inv, axis=k2)

    var = compute(outer, variance, name=f"{name}_var", tag=REDUCE)

    def body(*idx):
        y = (x[idx] - mean[stat(idx)]) * rsqrt(var[stat(idx)] + epsilon)
        if gamma is not None:
            y = y * gamma[idx[-1]]
        if beta is not None:
            y = y + beta[idx[-1]]
        return y

    return compute(x.shape, body, name=name, tag=BROADCAST, attrs={"epsilon": epsilon})


def batch_norm(x: Tensor, mean: Tensor, var: Tensor, gamma: Tensor, beta: Tensor, axis: int = -1,
               epsilon: float = 1e-5, name: str = "bn") -> Tensor:
    """Inference batch norm over channel `axis` (-1 for NHWC, 1 for NCHW).

    Per-channel stages `<name>_scale = gamma * rsqrt(var + eps)` and `<name>_shift = beta - mean * scale`,
    then `out = x * scale[c] + shift[c]`.
    """
    check_tensor(x, "batch_norm")
    _require_float(x, "batch_norm")
    axis = normalize_axis(axis, x.ndim, "batch_norm")
    channels = x.shape[axis]
    for what, t in (("mean", mean), ("var", var), ("gamma", gamma), ("beta", beta)):
        check_tensor(t, "batch_norm", what, ndim=1)
        check_same_dtype("batch_norm", x, t)
        if t.shape[0] != channels:
            raise TensorExprError(
                f"batch_norm: {what} {t.name}{list(t.shape)} does not match the {channels} channels of "
                f"{x.name}{list(x.shape)} along axis {axis}"
            )
    scale = compute((channels,), lambda c: gamma[c] * rsqrt(var[c] + epsilon), name=f"{name}_scale",
                    tag=ELEMWISE)
    shift = compute((channels,), lambda c: beta[c] - mean[c] * scale[c], name=f"{name}_shift", tag=ELEMWISE)
    return compute(x.shape, lambda *idx: x[idx] * scale[idx[axis]] + shift[idx[axis]], name=name,
                   tag=BROADCAST, attrs={"axis": axis, "epsilon": epsilon})
