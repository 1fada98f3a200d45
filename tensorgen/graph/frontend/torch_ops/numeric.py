"""Converters of ATen's numeric functions beyond the activations: trigonometry, logarithms and exponentials of other
bases, log1p and expm1, rounding, remainders and the rounding modes of division, atan2, and tests for NaN and
infinities. Where the IR has no op of its own, the function is a short formula of ONNX ops, exact where PyTorch's
is (its floor division is reproduced step by step)."""

from __future__ import annotations

import math

import numpy as np

from tensorgen.graph.frontend.torch_ops.core import (
    Converter,
    ConvertError,
    Emitter,
    Formula,
    Shape,
    arg,
    converts,
    operand,
    single,
    unary,
)

for _name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"):
    converts(f"aten.{_name}")(unary(_name.capitalize()))
converts("aten.sign")(unary("Sign"))



def _trunc(f: Formula, x: str) -> str:
    return f("Where", f("Less", x, f.const(0), out="bool"), f("Ceil", x), f("Floor", x))


def _rounding(kind: str) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """floor, ceil, trunc, round (halves to even; with `decimals`, as PyTorch scales by 10^decimals); an
        integer tensor is whole already."""
        f = Formula.of(cx, shapes)
        x = operand(cx, args[0], f.dtype)
        if not f.dtype.startswith("float"):
            return x
        if kind == "trunc":
            return _trunc(f, x)
        decimals = int(arg(args, kwargs, 1, "decimals", 0)) if kind == "round" else 0
        if decimals == 0:
            return f(kind.capitalize(), x)
        scale = f.const(10.0 ** abs(decimals))
        up, down = ("Mul", "Div") if decimals > 0 else ("Div", "Mul")
        return f(down, f("Round", f(up, x, scale)), scale)

    return convert


for _kind in ("floor", "ceil", "trunc", "round"):
    converts(f"aten.{_kind}")(_rounding(_kind))


def _float_test(op: str, **attrs: int) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        shape, _ = single(shapes)
        dtype = cx.value(cx.tensor(args[0])).dtype
        return cx.emit(op, [operand(cx, args[0], dtype if dtype.startswith("float") else "float32")], attrs,
                       shapes=[(shape, "bool")])[0]

    return convert


converts("aten.isnan")(_float_test("IsNaN"))
converts("aten.isinf")(_float_test("IsInf", detect_negative=1, detect_positive=1))
converts("aten.isposinf")(_float_test("IsInf", detect_negative=0, detect_positive=1))
converts("aten.isneginf")(_float_test("IsInf", detect_negative=1, detect_positive=0))


def _other_base(log: bool, base: float) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """log2, log10: ln(x) / ln(base); exp2: exp(x ln 2)."""
        f = Formula.of(cx, shapes)
        x = operand(cx, args[0], f.dtype)
        if log:
            return f("Mul", f("Log", x), f.const(1 / math.log(base)))
        return f("Exp", f("Mul", x, f.const(math.log(base))))

    return convert


converts("aten.log2")(_other_base(log=True, base=2))
converts("aten.log10")(_other_base(log=True, base=10))
converts("aten.exp2")(_other_base(log=False, base=2))


def _near_one(log: bool) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """log1p and expm1 to float32's relative precision near 0, from ops that lose it there: log1p(x) =
        log(w) * x / (w - 1) with w = 1 + x (x where w rounds to 1: Kahan's); expm1(x) = 2t / (1 - t) with
        t = tanh(x / 2) where |x| < 1, else exp(x) - 1."""
        f = Formula.of(cx, shapes)
        x, one = operand(cx, args[0], f.dtype), f.const(1)
        if log:
            w = f("Add", x, one)
            kahan = f("Where", f("Equal", w, one, out="bool"), x, f("Div", f("Mul", f("Log", w), x), f("Sub", w, one)))
            return f("Where", f("Equal", x, f.const(np.inf), out="bool"), x, kahan)  # log1p(inf): inf / inf is NaN
        t = f("Tanh", f("Mul", x, f.const(0.5)))
        near = f("Div", f("Mul", t, f.const(2)), f("Sub", one, t))
        return f("Where", f("Less", f("Abs", x), one, out="bool"), near, f("Sub", f("Exp", x), one))

    return convert


converts("aten.log1p")(_near_one(log=True))
converts("aten.expm1")(_near_one(log=False))


def _remainder(fmod: int) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        """fmod: the sign of the dividend (C); remainder: the sign of the divisor (Python)."""
        f = Formula.of(cx, shapes)
        return f("Mod", operand(cx, args[0], f.dtype), operand(cx, args[1], f.dtype), fmod=fmod)

    return convert


converts("aten.remainder")(_remainder(0))
converts("aten.fmod")(_remainder(1))


@converts("aten.div")
def _div(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """True division, or rounded toward zero ('trunc') or down ('floor', and floor_divide). Integers: Div truncates
    as C does; floor is (a - a mod b) / b, exact. Floats round down as PyTorch does: q = (a - fmod(a, b)) / b, one
    less where the remainder's sign differs from b's, then floor(q) + (q - floor(q) > 0.5); a / b where b is 0."""
    f = Formula.of(cx, shapes)
    a, b = operand(cx, args[0], f.dtype), operand(cx, args[1], f.dtype)
    mode = kwargs.get("rounding_mode")
    if mode not in (None, "trunc", "floor"):
        raise ConvertError(f"rounding_mode={mode!r} (only None, 'trunc' and 'floor')")
    quotient = f("Div", a, b)
    if mode is None or (mode == "trunc" and not f.dtype.startswith("float")):
        return quotient
    if mode == "trunc":
        return _trunc(f, quotient)
    if not f.dtype.startswith("float"):
        return f("Div", f("Sub", a, f("Mod", a, b, fmod=0)), b)
    zero, one = f.const(0), f.const(1)
    rem = f("Mod", a, b, fmod=1)
    q = f("Div", f("Sub", a, rem), b)
    signs_differ = f("Xor", f("Less", b, zero, out="bool"), f("Less", rem, zero, out="bool"), out="bool")
    q = f("Where", f("And", f("Not", f("Equal", rem, zero, out="bool"), out="bool"), signs_differ, out="bool"),
          f("Sub", q, one), q)
    down = f("Floor", q)
    down = f("Where", f("Greater", f("Sub", q, down), f.const(0.5), out="bool"), f("Add", down, one), down)
    return f("Where", f("Equal", b, zero, out="bool"), quotient, down)


@converts("aten.floor_divide")
def _floor_divide(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    return _div(cx, args, {"rounding_mode": "floor"}, shapes)


@converts("aten.atan2")
def _atan2(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """atan(y / x), plus pi (y >= 0) or minus pi (y < 0) where x < 0; 0 where both are 0."""
    f = Formula.of(cx, shapes)
    y, x = operand(cx, args[0], f.dtype), operand(cx, args[1], f.dtype)
    zero = f.const(0)
    half_turn = f("Where", f("Less", y, zero, out="bool"), f.const(-math.pi), f.const(math.pi))
    angle = f("Add", f("Atan", f("Div", y, x)), f("Where", f("Less", x, zero, out="bool"), half_turn, zero))
    both_zero = f("And", f("Equal", x, zero, out="bool"), f("Equal", y, zero, out="bool"), out="bool")
    return f("Where", both_zero, zero, angle)
