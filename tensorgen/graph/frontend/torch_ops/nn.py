"""Converters of ATen's linear algebra, normalizations, attention, convolution, pooling and upsampling."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorgen.graph.frontend.torch_ops.core import (
    ConvertError,
    Emitter,
    Formula,
    Shape,
    arg,
    converts,
    operand,
    single,
)


@converts("aten.mm", "aten.bmm", "aten.matmul")
def _matmul(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    return cx.emit("MatMul", [operand(cx, args[0], dtype), operand(cx, args[1], dtype)], shapes=[(shape, dtype)])[0]


@converts("aten.addmm")
def _addmm(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """beta * bias + alpha * (a @ b): a Gemm. A constant `b` (nn.Linear's weight.T, folded) is stored as the
    weight itself with transB=1, as torch.onnx exports a Linear: the same task as the ONNX model's."""
    shape, dtype = single(shapes)
    bias, a = operand(cx, args[0], dtype), operand(cx, args[1], dtype)
    weight = args[2]
    if cx.is_runtime(weight):
        b, trans_b = operand(cx, weight, dtype), 0
    else:
        b, trans_b = cx.tensor(weight.t(), dtype), 1
    attrs = {"alpha": float(arg(args, kwargs, 4, "alpha", 1)), "beta": float(arg(args, kwargs, 3, "beta", 1)),
             "transA": 0, "transB": trans_b}
    return cx.emit("Gemm", [a, b, bias], attrs, shapes=[(shape, dtype)])[0]


def _affine(cx: Emitter, x: Any, fill: float, size: int, dtype: str) -> str:
    """A norm's weight or bias; `fill` everywhere when the module has none (affine=False)."""
    return operand(cx, x, dtype) if x is not None else cx.tensor(np.full(size, fill, dtype=dtype))


@converts("aten._native_batch_norm_legit_no_training")
def _batch_norm(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple:
    shape, dtype = shapes[0]
    x, weight, bias, mean, var = args[:5]
    channels = shape[1]
    inputs = [operand(cx, x, dtype), _affine(cx, weight, 1.0, channels, dtype), _affine(cx, bias, 0.0, channels, dtype),
              operand(cx, mean, dtype), operand(cx, var, dtype)]
    eps = float(arg(args, kwargs, 6, "eps", 1e-5))
    (out,) = cx.emit("BatchNormalization", inputs, {"epsilon": eps}, shapes=[(shape, dtype)])
    return (out, *(None,) * (len(shapes) - 1))


@converts("aten._native_batch_norm_legit")
def _batch_statistics_norm(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple:
    """Batch norm with the statistics of its input (training=True), as F.instance_norm calls it on the input viewed
    as one sample of N * C channels: InstanceNormalization where the batch is one sample. Both overloads (with
    running statistics, which it would update, and without)."""
    shape, dtype = shapes[0]
    x, weight, bias = args[:3]
    training, eps = (args[3], args[5]) if len(args) == 6 else (args[5], args[7])  # .no_stats / with running stats
    if shape[0] != 1 or not training or len(shape) < 3:
        raise ConvertError("batch norm in training mode over a batch of more than one sample")
    channels = shape[1]
    inputs = [operand(cx, x, dtype), _affine(cx, weight, 1.0, channels, dtype), _affine(cx, bias, 0.0, channels, dtype)]
    (out,) = cx.emit("InstanceNormalization", inputs, {"epsilon": float(eps)}, shapes=[(shape, dtype)])
    return (out, *(None,) * (len(shapes) - 1))


@converts("aten.native_group_norm")
def _group_norm(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple:
    """GroupNorm: the input viewed as (N, groups, rest), each group normalized as an instance, viewed back, then the
    per-channel weight and bias."""
    shape, dtype = shapes[0]
    x, weight, bias = args[:3]
    groups, eps = int(args[6]), float(args[7])
    batch, channels = shape[:2]
    (flat,) = cx.emit("Reshape", [operand(cx, x, dtype)],
                      shapes=[((batch, groups, int(np.prod(shape[1:])) // groups), dtype)])
    unit = [_affine(cx, None, 1.0, groups, dtype), _affine(cx, None, 0.0, groups, dtype)]
    (normed,) = cx.emit("InstanceNormalization", [flat, *unit], {"epsilon": eps},
                        shapes=[(cx.value(flat).shape, dtype)])
    (out,) = cx.emit("Reshape", [normed], shapes=[(shape, dtype)])
    per_channel = (channels, *(1,) * (len(shape) - 2))
    for op, t in (("Mul", weight), ("Add", bias)):
        if t is not None:
            (t_c,) = cx.emit("Reshape", [operand(cx, t, dtype)], shapes=[(per_channel, dtype)])
            (out,) = cx.emit(op, [out, t_c], shapes=[(shape, dtype)])
    return (out, *(None,) * (len(shapes) - 1))


@converts("aten.native_layer_norm")
def _layer_norm(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple:
    shape, dtype = shapes[0]
    x, normalized, weight, bias = args[:4]
    size = int(np.prod(normalized))
    inputs = [operand(cx, x, dtype), _affine(cx, weight, 1.0, size, dtype), _affine(cx, bias, 0.0, size, dtype)]
    if len(normalized) > 1:  # ONNX's scale has the normalized shape
        inputs[1:] = [cx.emit("Reshape", [name], shapes=[(tuple(normalized), dtype)])[0] for name in inputs[1:]]
    attrs = {"axis": -len(normalized), "epsilon": float(arg(args, kwargs, 4, "eps", 1e-5))}
    (out,) = cx.emit("LayerNormalization", inputs, attrs, shapes=[(shape, dtype)])
    return (out, *(None,) * (len(shapes) - 1))


@converts("aten.scaled_dot_product_attention")
def _attention(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """softmax(q @ k^T * scale + mask) @ v, written as ONNX exporters write BERT's attention: the default scale
    as a division by sqrt(head size). A boolean mask (or is_causal) adds -inf where attention is not allowed."""
    shape, dtype = single(shapes)
    q, k, v = (operand(cx, x, dtype) for x in args[:3])
    mask, dropout = arg(args, kwargs, 3, "attn_mask"), float(arg(args, kwargs, 4, "dropout_p", 0.0))
    causal, scale = bool(arg(args, kwargs, 5, "is_causal", False)), arg(args, kwargs, 6, "scale")
    q_shape, k_shape = cx.value(q).shape, cx.value(k).shape
    if dropout or kwargs.get("enable_gqa") or q_shape[:-2] != k_shape[:-2]:
        raise ConvertError("attention with dropout or grouped query heads is not supported")
    rank, (length, size), keys = len(q_shape), q_shape[-2:], k_shape[-2]
    scores_shape = (*q_shape[:-2], length, keys)
    (k_t,) = cx.emit("Transpose", [k], {"perm": [*range(rank - 2), rank - 1, rank - 2]},
                     shapes=[((*k_shape[:-2], size, keys), dtype)])
    (scores,) = cx.emit("MatMul", [q, k_t], shapes=[(scores_shape, dtype)])
    if scale is None:
        (scores,) = cx.emit("Div", [scores, cx.tensor(np.array(np.sqrt(size), dtype))], shapes=[(scores_shape, dtype)])
    else:
        (scores,) = cx.emit("Mul", [scores, cx.tensor(np.array(scale, dtype))], shapes=[(scores_shape, dtype)])
    bias = _attention_bias(cx, mask, causal, length, keys, dtype)
    if bias is not None:
        (scores,) = cx.emit("Add", [scores, bias], shapes=[(scores_shape, dtype)])
    (probs,) = cx.emit("Softmax", [scores], {"axis": -1}, shapes=[(scores_shape, dtype)])
    if _may_block_a_row(cx, mask):
        probs = _zero_where_blocked(cx, scores, probs, -1)
    return cx.emit("MatMul", [probs, v], shapes=[(shape, dtype)])[0]


def _may_block_a_row(cx: Emitter, mask: Any) -> bool:
    """Whether a query may find every key masked: a mask computed at run time, or a constant with such a row."""
    if mask is None:
        return False
    if cx.is_runtime(mask):
        return True
    allowed = np.asarray(mask)
    blocked = ~allowed if allowed.dtype == np.bool_ else np.isneginf(allowed)
    return bool(np.any(np.all(blocked, axis=-1)))


def _zero_where_blocked(cx: Emitter, scores: str, probs: str, axis: int) -> str:
    """`probs` (a softmax of `scores` along `axis`) with 0 where every score of a row is -inf, as PyTorch's
    attention and _safe_softmax give (a query that may attend to nothing), where Softmax gives NaN."""
    f = Formula(cx, cx.value(scores).dtype)
    top = f.reduce("ReduceMax", scores, axis, keepdims=True)
    return f("Where", f("Equal", top, f.const(-np.inf), out="bool"), f.const(0), probs)


def _attention_bias(cx: Emitter, mask: Any, causal: bool, length: int, keys: int, dtype: str) -> str | None:
    """What attention adds to its scores: a float mask itself; a boolean one (True: may attend) as 0 / -inf."""
    def blocked(allowed: np.ndarray) -> str:
        return cx.tensor(np.where(allowed, 0.0, -np.inf).astype(dtype))

    if causal:
        if mask is not None:
            raise ConvertError("attention with both attn_mask and is_causal is not supported")
        return blocked(np.tril(np.ones((length, keys), bool)))
    if mask is None:
        return None
    if not cx.is_runtime(mask):
        allowed = np.asarray(mask)
        return blocked(allowed) if allowed.dtype == np.bool_ else operand(cx, mask, dtype)
    name = cx.tensor(mask)
    value = cx.value(name)
    if value.dtype != "bool":
        return operand(cx, mask, dtype)
    zero, minus_inf = cx.tensor(np.array(0.0, dtype)), cx.tensor(np.array(-np.inf, dtype))
    return cx.emit("Where", [name, zero, minus_inf], shapes=[(value.shape, dtype)])[0]


@converts("aten._log_softmax")
def _log_softmax(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    return cx.emit("LogSoftmax", [operand(cx, args[0], dtype)], {"axis": int(args[1])}, shapes=[(shape, dtype)])[0]


@converts("aten._softmax")
def _softmax(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    return cx.emit("Softmax", [operand(cx, args[0], dtype)], {"axis": int(args[1])}, shapes=[(shape, dtype)])[0]


@converts("aten._safe_softmax")
def _safe_softmax(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """Attention's softmax: 0 on a row whose every input is -inf (a query with nothing to attend to)."""
    return _zero_where_blocked(cx, operand(cx, args[0], single(shapes)[1]), _softmax(cx, args, kwargs, shapes),
                               int(args[1]))


# ---- windows ------------------------------------------------------------------------------------------


def _per_axis(values: Any, rank: int, name: str) -> tuple[int, ...]:
    values = [int(v) for v in (values if isinstance(values, (list, tuple)) else [values])]
    if len(values) == 1:
        values *= rank
    if len(values) != rank:
        raise ConvertError(f"{name}={values} must have 1 or {rank} entries")
    return tuple(values)


@converts("aten.convolution")
def _convolution(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    w = operand(cx, weight, dtype)
    rank = len(cx.value(w).shape) - 2
    pads = _per_axis(padding, rank, "padding")
    attrs = {"kernel_shape": cx.value(w).shape[2:], "strides": _per_axis(stride, rank, "stride"),
             "pads": pads + pads, "dilations": _per_axis(dilation, rank, "dilation"), "group": int(groups),
             "auto_pad": "NOTSET"}
    if transposed:
        attrs["output_padding"] = _per_axis(output_padding, rank, "output_padding")
    inputs = [operand(cx, x, dtype), w] + ([operand(cx, bias, dtype)] if bias is not None else [])
    return cx.emit("ConvTranspose" if transposed else "Conv", inputs, attrs, shapes=[(shape, dtype)])[0]


def _pool_attrs(args: tuple, kwargs: dict, rank: int) -> dict[str, Any]:
    kernel = _per_axis(args[1], rank, "kernel_size")
    stride = arg(args, kwargs, 2, "stride", [])
    pads = _per_axis(arg(args, kwargs, 3, "padding", 0), rank, "padding")
    return {"kernel_shape": kernel, "strides": _per_axis(stride, rank, "stride") if stride else kernel,
            "pads": pads + pads, "auto_pad": "NOTSET"}


@converts("aten.max_pool2d_with_indices", "aten.max_pool2d", "aten.max_pool1d", "aten.max_pool3d",
          "aten.max_pool3d_with_indices")
def _max_pool(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> Any:
    shape, dtype = shapes[0]
    rank = len(shape) - 2
    attrs = {**_pool_attrs(args, kwargs, rank), "dilations": _per_axis(arg(args, kwargs, 4, "dilation", 1), rank,
                                                                       "dilation"),
             "ceil_mode": int(bool(arg(args, kwargs, 5, "ceil_mode", False))), "storage_order": 0}
    (out,) = cx.emit("MaxPool", [operand(cx, args[0], dtype)], attrs, shapes=[(shape, dtype)])
    return (out, *(None,) * (len(shapes) - 1)) if len(shapes) > 1 else out


@converts("aten.avg_pool2d", "aten.avg_pool1d", "aten.avg_pool3d")
def _avg_pool(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    if arg(args, kwargs, 6, "divisor_override") is not None:
        raise ConvertError("divisor_override is not supported")
    attrs = {**_pool_attrs(args, kwargs, len(shape) - 2),
             "ceil_mode": int(bool(arg(args, kwargs, 4, "ceil_mode", False))),
             "count_include_pad": int(bool(arg(args, kwargs, 5, "count_include_pad", True)))}
    return cx.emit("AveragePool", [operand(cx, args[0], dtype)], attrs, shapes=[(shape, dtype)])[0]


def _scale_factors(args: tuple, at: int, count: int) -> list[float | None]:
    """An upsampling call's scale factors (None: none given) for its `count` resized axes: a list at `at` (the .vec
    overloads) or one argument per axis from `at` on (.default)."""
    given = args[at] if len(args) > at and isinstance(args[at], (list, tuple)) else args[at:]
    return [*(given or ()), *[None] * count][:count]


def _source_step(n: int, m: int, factor: float | None) -> np.float32:
    """How far apart in the input PyTorch reads `m` outputs along an axis of `n`: 1 / scale_factor where the user
    gave one, else n / m, in float32."""
    return np.float32(1.0 / factor) if factor else np.float32(n) / np.float32(m)


def _nearest_table(n: int, m: int, factor: float | None) -> tuple[np.ndarray, bool]:
    """The input index PyTorch's nearest reads for each of `m` outputs along an axis of `n`: min(floor(o * s), n - 1)
    in float32, s the _source_step; and whether ONNX Resize's asymmetric floor, o / (m / n), reads the same (integer
    ratios do; 9 -> 6 does not: 2 * 1.5 is 3, 2 / 0.6666667 is 2.9999998)."""
    table = np.minimum(np.floor(np.arange(m, dtype=np.float32) * _source_step(n, m, factor)), n - 1).astype(np.int64)
    resize = np.minimum(np.floor(np.arange(m) / np.float64(np.float32(m / n))), n - 1).astype(np.int64)
    return table, bool(np.array_equal(table, resize))


@converts("aten.upsample_nearest2d", "aten.upsample_nearest1d", "aten.upsample_nearest3d")
def _upsample_nearest(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """ONNX Resize (asymmetric, floor) where it reads what PyTorch does, else a Gather of PyTorch's table per axis.
    The scale factors come as a list (the .vec overload) or one argument per axis (.default)."""
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    sizes, axes = cx.value(x).shape, range(2, len(shape))
    tables = [_nearest_table(sizes[a], shape[a], f) for a, f in zip(axes, _scale_factors(args, 2, len(axes)))]
    if all(same for _, same in tables):
        scales = np.array([o / i for o, i in zip(shape, sizes)], dtype=np.float32)
        attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        return cx.emit("Resize", [x, "", cx.tensor(scales)], attrs, shapes=[(shape, dtype)])[0]
    current = list(sizes)
    for a, (table, _) in zip(axes, tables):
        if not np.array_equal(table, np.arange(sizes[a])):
            current[a] = shape[a]
            (x,) = cx.emit("Gather", [x, cx.tensor(table)], {"axis": a}, shapes=[(tuple(current), dtype)])
    return x


def _linear_taps(n: int, m: int, align_corners: bool, factor: float | None) -> tuple[np.ndarray, ...]:
    """PyTorch's linear interpolation along an axis of `n` read at `m` points, in float32: the two input indices and
    their weights for each output (align_corners: o * (n - 1) / (m - 1); else (o + 0.5) * s - 0.5, at least 0,
    s the _source_step)."""
    o = np.arange(m, dtype=np.float32)
    if align_corners:
        source = o * (np.float32(n - 1) / np.float32(m - 1) if m > 1 else np.float32(0))
    else:
        source = np.maximum((o + np.float32(0.5)) * _source_step(n, m, factor) - np.float32(0.5), np.float32(0))
    low = np.minimum(np.floor(source).astype(np.int64), n - 1)
    high = np.minimum(low + 1, n - 1)
    weight = (source - low).astype(np.float32)
    return low, high, np.float32(1) - weight, weight


@converts("aten.upsample_bilinear2d", "aten.upsample_linear1d")
def _upsample_linear(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """Separable: along each resized axis two Gathers of PyTorch's source indices, weighted and added (the
    weights' float32 arithmetic is PyTorch's; the sum's order is one axis after the other)."""
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    sizes, axes = cx.value(x).shape, range(2, len(shape))
    align = bool(arg(args, kwargs, 2, "align_corners", False))
    current = list(sizes)
    for a, factor in zip(axes, _scale_factors(args, 3, len(axes))):
        if sizes[a] == shape[a] and factor in (None, 1.0):
            continue
        low, high, w_low, w_high = _linear_taps(sizes[a], shape[a], align, factor)
        current[a] = shape[a]
        out_shape, weight_shape = tuple(current), (shape[a], *(1,) * (len(shape) - 1 - a))
        terms = []
        for index, weight in ((low, w_low), (high, w_high)):
            (taps,) = cx.emit("Gather", [x, cx.tensor(index)], {"axis": a}, shapes=[(out_shape, dtype)])
            terms.append(cx.emit("Mul", [taps, cx.tensor(weight.astype(dtype).reshape(weight_shape))],
                                 shapes=[(out_shape, dtype)])[0])
        (x,) = cx.emit("Add", terms, shapes=[(out_shape, dtype)])
    return x
