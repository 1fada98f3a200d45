"""Converters from Core ATen calls to graph-IR nodes, one small function per op, in a table.

A converter gets the import (`Emitter`: it makes constants and emits ONNX-vocabulary nodes that the ONNX
frontend's normalizers then check and complete), the call's arguments — run-time values, constant tensors or
Python values — and the (shape, dtype) of each output from the exported graph. It returns the name of its
output value (a tuple for ops with several; None where an output is one tensorgen does not compute, such as
batch norm's training statistics). Register your own with `@converts("aten.my_op")`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from tensorgen.graph.ir import GraphError, Value

Shape = tuple[tuple[int, ...], str]  # (shape, dtype) of an output
INT64_MAX = np.iinfo(np.int64).max


class ConvertError(GraphError):
    """An ATen call the IR cannot express (an unsupported argument value)."""


class Emitter(Protocol):
    """What a converter may ask of the import (tensorgen.graph.frontend.torch_import.TorchImport)."""

    def emit(self, op: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None, *,
             shapes: Sequence[Shape], label: str = "") -> list[str]: ...

    def tensor(self, x: Any, dtype: str | None = None) -> str: ...

    def constant(self, array: Any, base: str = "const") -> str: ...

    def value(self, name: str) -> Value: ...

    def is_runtime(self, x: Any) -> bool: ...


Converter = Callable[[Emitter, tuple, dict, list[Shape]], Any]
CONVERTERS: dict[str, Converter] = {}


def converts(*ops: str) -> Callable[[Converter], Converter]:
    """Register a converter for ATen overload packets ("aten.relu")."""
    def register(fn: Converter) -> Converter:
        for op in ops:
            CONVERTERS[op] = fn
        return fn

    return register


def arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    """Argument `i` (or keyword `name`) of a call, `default` when absent."""
    return args[i] if i < len(args) else kwargs.get(name, default)


def operand(cx: Emitter, x: Any, dtype: str) -> str:
    """`x` as a value of `dtype`: run-time values of another dtype are Cast, constants converted."""
    if x is None:
        raise ConvertError("reads an output tensorgen does not compute (training statistics or pooling indices)")
    if not cx.is_runtime(x):
        return cx.tensor(x, dtype)
    name = cx.tensor(x)
    value = cx.value(name)
    if value.dtype == dtype:
        return name
    return cx.emit("Cast", [name], {"to": _onnx_type(dtype)}, shapes=[(value.shape, dtype)])[0]


def _onnx_type(dtype: str) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _single(shapes: list[Shape]) -> Shape:
    return shapes[0]


# ---- elementwise --------------------------------------------------------------------------------------


def _unary(op: str, **attrs: Any) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        shape, dtype = _single(shapes)
        return cx.emit(op, [operand(cx, args[0], dtype)], attrs, shapes=[(shape, dtype)])[0]

    return convert


for _aten, _op in {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "erf": "Erf", "exp": "Exp", "sqrt": "Sqrt",
                   "reciprocal": "Reciprocal", "neg": "Neg", "abs": "Abs", "hardswish": "HardSwish",
                   "log": "Log"}.items():
    converts(f"aten.{_aten}")(_unary(_op))
converts("aten.hardsigmoid")(_unary("HardSigmoid", alpha=1 / 6, beta=0.5))


@converts("aten.clone", "aten.alias", "aten.lift_fresh_copy", "aten.detach", "aten._to_copy", "aten.contiguous")
def _same_value(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """A copy is the value itself (a Cast where the dtype changes; a device or layout change is nothing here)."""
    return operand(cx, args[0], _single(shapes)[1])


def _near_one(log: bool) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """log1p and expm1 to float32's relative precision near 0, from ops that lose it there: log1p(x) =
        log(w) * x / (w - 1) with w = 1 + x (x where w rounds to 1: Kahan's); expm1(x) = 2t / (1 - t) with
        t = tanh(x / 2) where |x| < 1, else exp(x) - 1."""
        shape, dtype = _single(shapes)

        def op(name: str, *inputs: str, out: str = dtype) -> str:
            return cx.emit(name, list(inputs), shapes=[(shape, out)])[0]

        def c(value: float) -> str:
            return cx.tensor(np.array(value, dtype=dtype))

        x = operand(cx, args[0], dtype)
        if log:
            w = op("Add", x, c(1))
            kahan = op("Where", op("Equal", w, c(1), out="bool"), x,
                       op("Div", op("Mul", op("Log", w), x), op("Sub", w, c(1))))
            return op("Where", op("Equal", x, c(np.inf), out="bool"), x, kahan)  # log1p(inf): inf / inf is NaN
        t = op("Tanh", op("Mul", x, c(0.5)))
        near = op("Div", op("Mul", t, c(2)), op("Sub", c(1), t))
        return op("Where", op("Less", op("Abs", x), c(1), out="bool"), near, op("Sub", op("Exp", x), c(1)))

    return convert


converts("aten.log1p")(_near_one(log=True))
converts("aten.expm1")(_near_one(log=False))


@converts("aten.elu")
def _elu(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """elu(x, alpha, scale, input_scale): Elu, or Selu (F.selu's scale) where the input is not scaled."""
    shape, dtype = _single(shapes)
    alpha, scale = float(arg(args, kwargs, 1, "alpha", 1.0)), float(arg(args, kwargs, 2, "scale", 1.0))
    if float(arg(args, kwargs, 3, "input_scale", 1.0)) != 1.0:
        raise ConvertError("elu with input_scale != 1")
    op, attrs = ("Elu", {"alpha": alpha}) if scale == 1.0 else ("Selu", {"alpha": alpha, "gamma": scale})
    return cx.emit(op, [operand(cx, args[0], dtype)], attrs, shapes=[(shape, dtype)])[0]


@converts("aten.rsqrt")
def _rsqrt(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    (root,) = cx.emit("Sqrt", [operand(cx, args[0], dtype)], shapes=[(shape, dtype)])
    return cx.emit("Reciprocal", [root], shapes=[(shape, dtype)])[0]


@converts("aten.silu")
def _silu(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    x = operand(cx, args[0], dtype)
    (gate,) = cx.emit("Sigmoid", [x], shapes=[(shape, dtype)])
    return cx.emit("Mul", [x, gate], shapes=[(shape, dtype)])[0]


@converts("aten.gelu")
def _gelu(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    approximate = arg(args, kwargs, 1, "approximate", "none")
    return cx.emit("Gelu", [operand(cx, args[0], dtype)], {"approximate": approximate}, shapes=[(shape, dtype)])[0]


@converts("aten.leaky_relu")
def _leaky_relu(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    alpha = float(arg(args, kwargs, 1, "negative_slope", 0.01))
    return cx.emit("LeakyRelu", [operand(cx, args[0], dtype)], {"alpha": alpha}, shapes=[(shape, dtype)])[0]


def _clip(cx: Emitter, x: Any, low: Any, high: Any, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    if cx.is_runtime(low) or cx.is_runtime(high):
        raise ConvertError("bounds computed at run time are not supported (constant bounds only)")
    bounds = [cx.tensor(np.array(b, dtype=dtype)) if b is not None else "" for b in (low, high)]
    return cx.emit("Clip", [operand(cx, x, dtype), *bounds], shapes=[(shape, dtype)])[0]


@converts("aten.clamp")
def _clamp(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    return _clip(cx, args[0], arg(args, kwargs, 1, "min"), arg(args, kwargs, 2, "max"), shapes)


@converts("aten.hardtanh")
def _hardtanh(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    return _clip(cx, args[0], arg(args, kwargs, 1, "min_val", -1.0), arg(args, kwargs, 2, "max_val", 1.0), shapes)


def _binary(op: str) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        shape, dtype = _single(shapes)
        a, b = operand(cx, args[0], dtype), operand(cx, args[1], dtype)
        alpha = arg(args, kwargs, 2, "alpha", 1)
        if alpha != 1:
            b = cx.emit("Mul", [b, cx.tensor(np.array(alpha, dtype=dtype))],
                        shapes=[(cx.value(b).shape, dtype)])[0]
        return cx.emit(op, [a, b], shapes=[(shape, dtype)])[0]

    return convert


for _aten, _op in {"add": "Add", "sub": "Sub", "mul": "Mul", "maximum": "Max", "minimum": "Min"}.items():
    converts(f"aten.{_aten}")(_binary(_op))


@converts("aten.div")
def _div(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    mode = kwargs.get("rounding_mode")
    if mode is not None:
        raise ConvertError(f"rounding_mode={mode!r} is not supported (true division only)")
    return _binary("Div")(cx, args, {}, shapes)


@converts("aten.rsub")
def _rsub(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """other - alpha * self."""
    return _binary("Sub")(cx, (args[1], args[0], arg(args, kwargs, 2, "alpha", 1)), {}, shapes)


@converts("aten.pow")
def _pow(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    return cx.emit("Pow", [operand(cx, args[0], dtype), operand(cx, args[1], dtype)], shapes=[(shape, dtype)])[0]


def _comparison(op: str, negate: bool = False) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """`x > 0`, `ids == pad`, ...: both sides in the dtype PyTorch compares them in; `ne` is Not(Equal)."""
        shape, _ = _single(shapes)
        dtype = _compared_dtype(cx, args[:2])
        (out,) = cx.emit(op, [operand(cx, args[0], dtype), operand(cx, args[1], dtype)], shapes=[(shape, "bool")])
        return cx.emit("Not", [out], shapes=[(shape, "bool")])[0] if negate else out

    return convert


def _compared_dtype(cx: Emitter, xs: Sequence[Any]) -> str:
    """The run-time operands' promoted dtype; float32 where an integer tensor meets a float constant."""
    dtype = str(np.result_type(*(cx.value(cx.tensor(x)).dtype for x in xs if cx.is_runtime(x))))
    floats = any(np.asarray(x).dtype.kind == "f" for x in xs if not cx.is_runtime(x))
    return "float32" if floats and not dtype.startswith("float") else dtype


for _aten, _op in {"gt": "Greater", "lt": "Less", "ge": "GreaterOrEqual", "le": "LessOrEqual", "eq": "Equal"}.items():
    converts(f"aten.{_aten}")(_comparison(_op))
converts("aten.ne")(_comparison("Equal", negate=True))


@converts("aten.logical_not", "aten.bitwise_not")
def _not(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    if dtype != "bool":
        raise ConvertError(f"bitwise_not of {dtype} (only of bool: logical not)")
    return cx.emit("Not", [operand(cx, args[0], "bool")], shapes=[(shape, "bool")])[0]


def _logic(op: str) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """logical_and/or/xor of any dtypes (non-zero is true); the bitwise ones of bools only."""
        shape, dtype = _single(shapes)
        if dtype != "bool":
            raise ConvertError(f"a bitwise operation on {dtype} (only on bool: logical)")
        return cx.emit(op, [operand(cx, args[0], "bool"), operand(cx, args[1], "bool")], shapes=[(shape, "bool")])[0]

    return convert


for _aten, _op in {"and": "And", "or": "Or", "xor": "Xor"}.items():
    converts(f"aten.logical_{_aten}", f"aten.bitwise_{_aten}")(_logic(_op))


@converts("aten.where")
def _where(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    cond = operand(cx, args[0], "bool")
    return cx.emit("Where", [cond, operand(cx, args[1], dtype), operand(cx, args[2], dtype)],
                   shapes=[(shape, dtype)])[0]


# ---- linear algebra and normalization -----------------------------------------------------------------


@converts("aten.mm", "aten.bmm", "aten.matmul")
def _matmul(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    return cx.emit("MatMul", [operand(cx, args[0], dtype), operand(cx, args[1], dtype)], shapes=[(shape, dtype)])[0]


@converts("aten.addmm")
def _addmm(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """beta * bias + alpha * (a @ b): a Gemm. A constant `b` (nn.Linear's weight.T, folded) is stored as the
    weight itself with transB=1, as torch.onnx exports a Linear: the same task as the ONNX model's."""
    shape, dtype = _single(shapes)
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
    shape, dtype = _single(shapes)
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
    return cx.emit("MatMul", [probs, v], shapes=[(shape, dtype)])[0]


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
    shape, dtype = _single(shapes)
    return cx.emit("LogSoftmax", [operand(cx, args[0], dtype)], {"axis": int(args[1])}, shapes=[(shape, dtype)])[0]


@converts("aten._softmax", "aten._safe_softmax")
def _softmax(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """`_safe_softmax` becomes a plain Softmax. They differ only on a row whose every input is -inf (a query that
    may attend to nothing): PyTorch returns zeros there, the Softmax NaNs."""
    shape, dtype = _single(shapes)
    return cx.emit("Softmax", [operand(cx, args[0], dtype)], {"axis": int(args[1])}, shapes=[(shape, dtype)])[0]


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
    shape, dtype = _single(shapes)
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
    shape, dtype = _single(shapes)
    if arg(args, kwargs, 6, "divisor_override") is not None:
        raise ConvertError("divisor_override is not supported")
    attrs = {**_pool_attrs(args, kwargs, len(shape) - 2),
             "ceil_mode": int(bool(arg(args, kwargs, 4, "ceil_mode", False))),
             "count_include_pad": int(bool(arg(args, kwargs, 5, "count_include_pad", True)))}
    return cx.emit("AveragePool", [operand(cx, args[0], dtype)], attrs, shapes=[(shape, dtype)])[0]


@converts("aten._adaptive_avg_pool2d", "aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool3d")
def _adaptive_avg_pool(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """Global pooling, or windows of in / out when the output size divides the input's."""
    shape, dtype = _single(shapes)
    x = operand(cx, args[0], dtype)
    spatial, out = cx.value(x).shape[2:], shape[2:]
    if all(o == 1 for o in out):
        return cx.emit("GlobalAveragePool", [x], shapes=[(shape, dtype)])[0]
    if any(i % o for i, o in zip(spatial, out)):
        raise ConvertError(f"output size {list(out)} does not divide the input size {list(spatial)}")
    kernel = tuple(i // o for i, o in zip(spatial, out))
    attrs = {"kernel_shape": kernel, "strides": kernel, "pads": (0,) * (2 * len(kernel)), "auto_pad": "NOTSET",
             "ceil_mode": 0, "count_include_pad": 0}
    return cx.emit("AveragePool", [x], attrs, shapes=[(shape, dtype)])[0]


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
    shape, dtype = _single(shapes)
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
    shape, dtype = _single(shapes)
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


# ---- reductions ---------------------------------------------------------------------------------------


def _axes(cx: Emitter, x: str, dims: Any) -> list[int]:
    """The axes `dims` names: all where it is None or empty."""
    rank = len(cx.value(x).shape)
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return list(range(rank))
    return sorted(int(d) % rank for d in (dims if isinstance(dims, (list, tuple)) else [dims]))


def _reduce(op: str) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        shape, dtype = _single(shapes)
        x = operand(cx, args[0], dtype)
        rank, axes = len(cx.value(x).shape), _axes(cx, x, arg(args, kwargs, 1, "dim"))
        keepdims = bool(arg(args, kwargs, 2, "keepdim", False))
        if op == "ReduceMean" and keepdims and rank >= 3 and axes == list(range(2, rank)):
            return cx.emit("GlobalAveragePool", [x], shapes=[(shape, dtype)])[0]  # as ONNX models write it
        attrs = {"axes": axes, "keepdims": int(keepdims), "noop_with_empty_axes": 0}
        return cx.emit(op, [x], attrs, shapes=[(shape, dtype)])[0]

    return convert


converts("aten.mean")(_reduce("ReduceMean"))
converts("aten.sum")(_reduce("ReduceSum"))
converts("aten.amax")(_reduce("ReduceMax"))
converts("aten.amin")(_reduce("ReduceMin"))


@converts("aten.var")
def _var(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """var(x, dim, correction, keepdim): the mean of squared deviations from the mean, times n / (n - correction)."""
    shape, dtype = _single(shapes)
    x = operand(cx, args[0], dtype)
    full, axes = cx.value(x).shape, _axes(cx, x, arg(args, kwargs, 1, "dim"))
    count = int(np.prod([full[a] for a in axes]))
    correction = 1.0 if kwargs.get("correction") is None else float(kwargs["correction"])  # keyword-only in ATen
    keepdim = bool(kwargs.get("keepdim", False))
    kept = tuple(1 if d in axes else n for d, n in enumerate(full))
    reduce = {"axes": axes, "keepdims": 1, "noop_with_empty_axes": 0}
    (mean,) = cx.emit("ReduceMean", [x], reduce, shapes=[(kept, dtype)])
    (dev,) = cx.emit("Sub", [x, mean], shapes=[(full, dtype)])
    (sq,) = cx.emit("Mul", [dev, dev], shapes=[(full, dtype)])
    (total,) = cx.emit("ReduceSum", [sq], {**reduce, "keepdims": int(keepdim)}, shapes=[(shape, dtype)])
    return cx.emit("Div", [total, cx.tensor(np.array(max(count - correction, 0), dtype=dtype))],
                   shapes=[(shape, dtype)])[0]


@converts("aten.linalg_vector_norm")
def _vector_norm(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """The 2-norm (sqrt of the sum of squares), 1-norm (sum of |x|) or inf-norm (max |x|) over `dim`."""
    shape, dtype = _single(shapes)
    x = operand(cx, args[0], dtype)
    order = float(arg(args, kwargs, 1, "ord", 2))
    axes = _axes(cx, x, arg(args, kwargs, 2, "dim"))
    attrs = {"axes": axes, "keepdims": int(bool(arg(args, kwargs, 3, "keepdim", False))), "noop_with_empty_axes": 0}
    full = cx.value(x).shape
    if order == 2:
        (sq,) = cx.emit("Mul", [x, x], shapes=[(full, dtype)])
        (total,) = cx.emit("ReduceSum", [sq], attrs, shapes=[(shape, dtype)])
        return cx.emit("Sqrt", [total], shapes=[(shape, dtype)])[0]
    if order not in (1, np.inf):
        raise ConvertError(f"vector norm of order {order} (only 1, 2 and inf)")
    (magnitude,) = cx.emit("Abs", [x], shapes=[(full, dtype)])
    return cx.emit("ReduceSum" if order == 1 else "ReduceMax", [magnitude], attrs, shapes=[(shape, dtype)])[0]


def _arg_extreme(op: str) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """argmax / argmin along `dim` (the first index holding the extreme, as PyTorch), over everything flattened
        where there is no dim."""
        shape, _ = _single(shapes)
        x = cx.tensor(args[0])
        sizes, dtype = cx.value(x).shape, cx.value(x).dtype
        dim, keepdim = arg(args, kwargs, 1, "dim"), bool(arg(args, kwargs, 2, "keepdim", False))
        if dim is None:
            sizes, dim, keepdim = (int(np.prod(sizes)),), 0, False
            (x,) = cx.emit("Reshape", [x], shapes=[(sizes, dtype)])
        axis = int(dim) % len(sizes)
        reduced = tuple(1 if d == axis else n for d, n in enumerate(sizes) if keepdim or d != axis)
        attrs = {"axis": int(dim), "keepdims": int(keepdim), "select_last_index": 0}
        (out,) = cx.emit(op, [x], attrs, shapes=[(reduced, "int64")])
        return out if reduced == tuple(shape) else cx.emit("Reshape", [out], shapes=[(shape, "int64")])[0]

    return convert


converts("aten.argmax")(_arg_extreme("ArgMax"))
converts("aten.argmin")(_arg_extreme("ArgMin"))


# ---- shapes -------------------------------------------------------------------------------------------


@converts("aten.view", "aten._unsafe_view", "aten.reshape", "aten.view_copy")
def _view(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    return cx.emit("Reshape", [operand(cx, args[0], dtype)], shapes=[(shape, dtype)])[0]


@converts("aten.expand")
def _expand(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    x = operand(cx, args[0], dtype)
    if cx.value(x).shape == shape:
        return cx.emit("Identity", [x], shapes=[(shape, dtype)])[0]
    return cx.emit("Expand", [x], shapes=[(shape, dtype)])[0]


@converts("aten.permute", "aten.t", "aten.transpose")
def _permute(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    x = operand(cx, args[0], dtype)
    rank = len(cx.value(x).shape)
    if len(args) == 1:  # t
        perm = list(range(rank))[::-1]
    elif len(args) == 3:  # transpose(x, dim0, dim1)
        perm = list(range(rank))
        a, b = (int(d) % rank for d in args[1:3])
        perm[a], perm[b] = perm[b], perm[a]
    else:
        perm = [int(d) % rank for d in args[1]]
    return cx.emit("Transpose", [x], {"perm": perm}, shapes=[(shape, dtype)])[0]


@converts("aten.unsqueeze")
def _unsqueeze(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    axes = cx.tensor(np.array([int(args[1]) % len(shape)], dtype=np.int64))
    return cx.emit("Unsqueeze", [operand(cx, args[0], dtype), axes], shapes=[(shape, dtype)])[0]


@converts("aten.squeeze")
def _squeeze(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """PyTorch ignores a squeezed axis whose size is not 1; ONNX refuses it, so only size-1 axes are named."""
    shape, dtype = _single(shapes)
    x = operand(cx, args[0], dtype)
    before = cx.value(x).shape
    dims = arg(args, kwargs, 1, "dim")
    dims = range(len(before)) if dims is None else (dims if isinstance(dims, (list, tuple)) else [dims])
    axes = sorted({int(d) % max(len(before), 1) for d in dims if before and before[int(d)] == 1})
    if not axes:
        return cx.emit("Identity", [x], shapes=[(shape, dtype)])[0]
    return cx.emit("Squeeze", [x, cx.tensor(np.array(axes, dtype=np.int64))], shapes=[(shape, dtype)])[0]


@converts("aten.cat", "aten.concat")
def _cat(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    parts = [operand(cx, t, dtype) for t in args[0]]
    parts = [p for p in parts if cx.value(p).size] or parts[:1]  # PyTorch skips empty tensors
    axis = int(arg(args, kwargs, 1, "dim", 0))
    if len(parts) == 1:
        return cx.emit("Identity", parts, shapes=[(shape, dtype)])[0]
    return cx.emit("Concat", parts, {"axis": axis}, shapes=[(shape, dtype)])[0]


@converts("aten.slice")
def _slice(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    dim, start, end, step = (arg(args, kwargs, i, n, d) for i, n, d in
                             ((1, "dim", 0), (2, "start", None), (3, "end", None), (4, "step", 1)))
    consts = [np.array([v], dtype=np.int64) for v in (start if start is not None else 0,
                                                       min(end, INT64_MAX) if end is not None else INT64_MAX,
                                                       dim, step)]
    return cx.emit("Slice", [operand(cx, args[0], dtype), *map(cx.tensor, consts)], shapes=[(shape, dtype)])[0]


@converts("aten.select")
def _select(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    index = cx.tensor(np.array(int(args[2]), dtype=np.int64))
    return cx.emit("Gather", [operand(cx, args[0], dtype), index], {"axis": int(args[1])}, shapes=[(shape, dtype)])[0]


@converts("aten.split_with_sizes", "aten.split")
def _split(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple:
    dtype = shapes[0][1]
    axis = int(arg(args, kwargs, 2, "dim", 0))
    return tuple(cx.emit("Split", [operand(cx, args[0], dtype)], {"axis": axis}, shapes=shapes))


@converts("aten.constant_pad_nd")
def _pad(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """PyTorch lists (begin, end) pairs from the last axis backwards; ONNX all begins, then all ends."""
    shape, dtype = _single(shapes)
    pad = [int(p) for p in args[1]]
    rank = len(shape)
    if any(p < 0 for p in pad):
        raise ConvertError(f"negative padding {pad} (cropping) is not supported")
    pads = [0] * (2 * rank)
    for k in range(len(pad) // 2):
        axis = rank - 1 - k
        pads[axis], pads[rank + axis] = pad[2 * k], pad[2 * k + 1]
    value = np.array(float(arg(args, kwargs, 2, "value", 0.0)), dtype=dtype)
    inputs = [operand(cx, args[0], dtype), cx.tensor(np.array(pads, dtype=np.int64)), cx.tensor(value)]
    return cx.emit("Pad", inputs, {"mode": "constant"}, shapes=[(shape, dtype)])[0]


def _edge_pad(mode: str) -> Converter:
    """reflection_pad*d / replication_pad*d: the last axes padded by (begin, end) pairs, last axis first."""
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        shape, dtype = _single(shapes)
        rank, pad = len(shape), [int(p) for p in args[1]]
        pads = [0] * (2 * rank)
        for k in range(len(pad) // 2):
            pads[rank - 1 - k], pads[2 * rank - 1 - k] = pad[2 * k], pad[2 * k + 1]
        inputs = [operand(cx, args[0], dtype), cx.tensor(np.array(pads, dtype=np.int64))]
        return cx.emit("Pad", inputs, {"mode": mode}, shapes=[(shape, dtype)])[0]

    return convert


for _n in (1, 2, 3):
    converts(f"aten.reflection_pad{_n}d")(_edge_pad("reflect"))
    converts(f"aten.replication_pad{_n}d")(_edge_pad("edge"))


@converts("aten.index")
def _index(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """`x[..., idx]` with one index tensor (the others None): a Gather on that axis."""
    shape, dtype = _single(shapes)
    given = [(axis, ix) for axis, ix in enumerate(args[1]) if ix is not None]
    if len(given) != 1:
        raise ConvertError(f"indexing with {len(given)} index tensors is not supported (one, on one axis)")
    ((axis, ix),) = given
    return cx.emit("Gather", [operand(cx, args[0], dtype), cx.tensor(ix)], {"axis": axis},
                   shapes=[(shape, dtype)])[0]


@converts("aten.embedding")
def _embedding(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    return cx.emit("Gather", [operand(cx, args[0], dtype), cx.tensor(args[1])], {"axis": 0},
                   shapes=[(shape, dtype)])[0]


@converts("aten.index_select")
def _index_select(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = _single(shapes)
    return cx.emit("Gather", [operand(cx, args[0], dtype), cx.tensor(args[2])], {"axis": int(args[1])},
                   shapes=[(shape, dtype)])[0]


@converts("aten.gather")
def _gather(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """torch.gather(x, dim, index): ONNX GatherElements (index no larger than x off `dim`, as in both)."""
    shape, dtype = _single(shapes)
    index = cx.tensor(arg(args, kwargs, 2, "index"))
    return cx.emit("GatherElements", [operand(cx, args[0], dtype), index], {"axis": int(args[1])},
                   shapes=[(shape, dtype)])[0]


def _filled(fill: float | None) -> Converter:
    """`*_like` depends on its input's shape alone, which is static: a constant (`fill` None: full_like's)."""
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        shape, dtype = _single(shapes)
        value = arg(args, kwargs, 1, "fill_value") if fill is None else fill
        return cx.constant(np.full(shape, value, dtype=dtype), "filled")

    return convert


converts("aten.full_like")(_filled(None))
converts("aten.zeros_like")(_filled(0.0))
converts("aten.ones_like")(_filled(1.0))
