"""Converters of element-wise ATen calls: activations, arithmetic, comparisons and logic, copies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tensorgen.graph.frontend.torch_ops.core import (
    Converter,
    ConvertError,
    Emitter,
    Formula,
    Shape,
    arg,
    binary,
    converts,
    operand,
    single,
    unary,
)

for _aten, _op in {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "erf": "Erf", "exp": "Exp", "sqrt": "Sqrt",
                   "reciprocal": "Reciprocal", "neg": "Neg", "abs": "Abs", "hardswish": "HardSwish",
                   "log": "Log"}.items():
    converts(f"aten.{_aten}")(unary(_op))
converts("aten.hardsigmoid")(unary("HardSigmoid", alpha=1 / 6, beta=0.5))


@converts("aten.clone", "aten.alias", "aten.lift_fresh_copy", "aten.detach", "aten._to_copy", "aten.contiguous")
def _same_value(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """A copy is the value itself (a Cast where the dtype changes; a device or layout change is nothing here)."""
    return operand(cx, args[0], single(shapes)[1])


@converts("aten.elu")
def _elu(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """elu(x, alpha, scale, input_scale): Elu, or Selu (F.selu's scale) where the input is not scaled."""
    shape, dtype = single(shapes)
    alpha, scale = float(arg(args, kwargs, 1, "alpha", 1.0)), float(arg(args, kwargs, 2, "scale", 1.0))
    if float(arg(args, kwargs, 3, "input_scale", 1.0)) != 1.0:
        raise ConvertError("elu with input_scale != 1")
    op, attrs = ("Elu", {"alpha": alpha}) if scale == 1.0 else ("Selu", {"alpha": alpha, "gamma": scale})
    return cx.emit(op, [operand(cx, args[0], dtype)], attrs, shapes=[(shape, dtype)])[0]


@converts("aten.rsqrt")
def _rsqrt(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    (root,) = cx.emit("Sqrt", [operand(cx, args[0], dtype)], shapes=[(shape, dtype)])
    return cx.emit("Reciprocal", [root], shapes=[(shape, dtype)])[0]


@converts("aten.silu")
def _silu(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    (gate,) = cx.emit("Sigmoid", [x], shapes=[(shape, dtype)])
    return cx.emit("Mul", [x, gate], shapes=[(shape, dtype)])[0]


@converts("aten.gelu")
def _gelu(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    approximate = arg(args, kwargs, 1, "approximate", "none")
    return cx.emit("Gelu", [operand(cx, args[0], dtype)], {"approximate": approximate}, shapes=[(shape, dtype)])[0]


@converts("aten.leaky_relu")
def _leaky_relu(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    alpha = float(arg(args, kwargs, 1, "negative_slope", 0.01))
    return cx.emit("LeakyRelu", [operand(cx, args[0], dtype)], {"alpha": alpha}, shapes=[(shape, dtype)])[0]


def _clip(cx: Emitter, x: Any, low: Any, high: Any, shapes: list[Shape]) -> str:
    """Constant bounds: a Clip; bounds that are tensors: Max with the lower, then Min with the upper (as
    torch.clamp), broadcasting as they do."""
    shape, dtype = single(shapes)
    if cx.is_runtime(low) or cx.is_runtime(high):
        f, out = Formula(cx, dtype), operand(cx, x, dtype)
        for op, bound in (("Max", low), ("Min", high)):
            out = out if bound is None else f(op, out, operand(cx, bound, dtype))
        return out
    bounds = [cx.tensor(np.array(b, dtype=dtype)) if b is not None else "" for b in (low, high)]
    return cx.emit("Clip", [operand(cx, x, dtype), *bounds], shapes=[(shape, dtype)])[0]


@converts("aten.clamp")
def _clamp(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    return _clip(cx, args[0], arg(args, kwargs, 1, "min"), arg(args, kwargs, 2, "max"), shapes)


@converts("aten.hardtanh")
def _hardtanh(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    return _clip(cx, args[0], arg(args, kwargs, 1, "min_val", -1.0), arg(args, kwargs, 2, "max_val", 1.0), shapes)


for _aten, _op in {"add": "Add", "sub": "Sub", "mul": "Mul", "maximum": "Max", "minimum": "Min"}.items():
    converts(f"aten.{_aten}")(binary(_op))


@converts("aten.rsub")
def _rsub(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """other - alpha * self."""
    return binary("Sub")(cx, (args[1], args[0], arg(args, kwargs, 2, "alpha", 1)), {}, shapes)


@converts("aten.pow")
def _pow(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    return cx.emit("Pow", [operand(cx, args[0], dtype), operand(cx, args[1], dtype)], shapes=[(shape, dtype)])[0]


def _comparison(op: str, negate: bool = False) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """`x > 0`, `ids == pad`, ...: both sides in the dtype PyTorch compares them in; `ne` is Not(Equal)."""
        shape, _ = single(shapes)
        dtype = compared_dtype(cx, args[:2])
        (out,) = cx.emit(op, [operand(cx, args[0], dtype), operand(cx, args[1], dtype)], shapes=[(shape, "bool")])
        return cx.emit("Not", [out], shapes=[(shape, "bool")])[0] if negate else out

    return convert


def compared_dtype(cx: Emitter, xs: Sequence[Any]) -> str:
    """The run-time operands' promoted dtype; float32 where an integer tensor meets a float constant."""
    dtype = str(np.result_type(*(cx.value(cx.tensor(x)).dtype for x in xs if cx.is_runtime(x))))
    floats = any(np.asarray(x).dtype.kind == "f" for x in xs if not cx.is_runtime(x))
    return "float32" if floats and not dtype.startswith("float") else dtype


for _aten, _op in {"gt": "Greater", "lt": "Less", "ge": "GreaterOrEqual", "le": "LessOrEqual", "eq": "Equal"}.items():
    converts(f"aten.{_aten}")(_comparison(_op))
converts("aten.ne")(_comparison("Equal", negate=True))


@converts("aten.logical_not", "aten.bitwise_not")
def _not(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    if dtype != "bool":
        raise ConvertError(f"bitwise_not of {dtype} (only of bool: logical not)")
    return cx.emit("Not", [operand(cx, args[0], "bool")], shapes=[(shape, "bool")])[0]


def _logic(op: str) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """logical_and/or/xor of any dtypes (non-zero is true); the bitwise ones of bools only."""
        shape, dtype = single(shapes)
        if dtype != "bool":
            raise ConvertError(f"a bitwise operation on {dtype} (only on bool: logical)")
        return cx.emit(op, [operand(cx, args[0], "bool"), operand(cx, args[1], "bool")], shapes=[(shape, "bool")])[0]

    return convert


for _aten, _op in {"and": "And", "or": "Or", "xor": "Xor"}.items():
    converts(f"aten.logical_{_aten}", f"aten.bitwise_{_aten}")(_logic(_op))


@converts("aten.where")
def _where(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    cond = operand(cx, args[0], "bool")
    return cx.emit("Where", [cond, operand(cx, args[1], dtype), operand(cx, args[2], dtype)],
                   shapes=[(shape, dtype)])[0]
