"""Lowerings of the element-wise ops: activations, broadcasting arithmetic, Cast, Where, BatchNormalization.

Scalar constants become literals in the expression (no tensor read), so `x * 0.5` or `Pow(x, 2)`
cost nothing beyond the arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import reduce

from tensorgen.graph.ir import Node
from tensorgen.graph.ops.base import CASTABLE, FLOATS, NUMERIC, READABLE, Args, broadcast_load, lowering, operand
from tensorgen.te import expr as E
from tensorgen.te.ops import batch_norm, broadcast_shape
from tensorgen.te.ops.common import BROADCAST, ELEMWISE
from tensorgen.te.tensor import Tensor, compute

Unary = Callable[[E.Expr, Args], E.Expr]


def _pointwise(args: Args, fn: Callable[[Sequence[E.Expr]], E.Expr]) -> list[Tensor]:
    """The single output as `fn(output index)`, cast to the output's dtype; the inputs must broadcast to it."""
    out = args.out(0)
    shapes = [v.shape for v in args.inputs if v is not None]
    if reduce(broadcast_shape, shapes, ()) != out.shape:
        raise args.error(f"inputs {[list(s) for s in shapes]} do not broadcast to the output {list(out.shape)}")
    tag = ELEMWISE if all(s == out.shape for s in shapes) else BROADCAST
    return [compute(args.out_shape(), lambda *idx: fn(idx), name=args.name(), tag=tag, dtype=out.dtype)]


UNARY: dict[str, tuple[Unary, tuple[str, ...]]] = {
    "Relu": (lambda x, a: E.max_expr(x, E.const(0, x.dtype)), NUMERIC),
    "Neg": (lambda x, a: -x, NUMERIC),
    "Abs": (lambda x, a: E.absolute(x), NUMERIC),
    "Identity": (lambda x, a: x, READABLE),
    "Sigmoid": (lambda x, a: E.sigmoid(x), FLOATS),
    "Tanh": (lambda x, a: E.tanh(x), FLOATS),
    "Erf": (lambda x, a: E.erf(x), FLOATS),
    "Exp": (lambda x, a: E.exp(x), FLOATS),
    "Sqrt": (lambda x, a: E.sqrt(x), FLOATS),
    "Reciprocal": (lambda x, a: E.const(1.0, x.dtype) / x, FLOATS),
    "LeakyRelu": (lambda x, a: E.select(x >= 0.0, x, x * float(a.attr("alpha"))), FLOATS),
    "HardSigmoid": (lambda x, a: _hard_sigmoid(x, float(a.attr("alpha")), float(a.attr("beta"))), FLOATS),
    "HardSwish": (lambda x, a: x * _hard_sigmoid(x, 1.0 / 6.0, 0.5), FLOATS),
    "Gelu": (lambda x, a: _gelu(x, a), FLOATS),
    "Log": (lambda x, a: E.log(x), FLOATS),
    "Elu": (lambda x, a: E.select(x >= 0.0, x, (E.exp(x) - 1.0) * float(a.attr("alpha"))), FLOATS),
    "Selu": (lambda x, a: _selu(x, float(a.attr("alpha")), float(a.attr("gamma"))), FLOATS),
    "Celu": (lambda x, a: _celu(x, float(a.attr("alpha"))), FLOATS),
    "ThresholdedRelu": (lambda x, a: E.select(x > float(a.attr("alpha")), x, E.const(0.0, x.dtype)), FLOATS),
    "Softplus": (lambda x, a: _softplus(x), FLOATS),
    "Softsign": (lambda x, a: x / (E.absolute(x) + 1.0), FLOATS),
    "Mish": (lambda x, a: x * E.tanh(_softplus(x)), FLOATS),
    "Floor": (lambda x, a: E.floor(x), FLOATS),
    "Ceil": (lambda x, a: E.ceil(x), FLOATS),
    "Round": (lambda x, a: E.round_even(x), FLOATS),  # halves to even, as ONNX and NumPy
    "Sign": (lambda x, a: E.select(x > 0, E.const(1, x.dtype), E.select(x < 0, E.const(-1, x.dtype), x)), NUMERIC),
    **{op: ((lambda fn: lambda x, a: fn(x))(getattr(E, op.lower())), FLOATS)
       for op in ("Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")},
    "Shrink": (lambda x, a: _shrink(x, float(a.attr("lambd")), float(a.attr("bias"))), FLOATS),
}


def _shrink(x: E.Expr, lambd: float, bias: float) -> E.Expr:
    """x + bias below -lambd, x - bias above lambd, 0 between."""
    return E.select(x < -lambd, x + bias, E.select(x > lambd, x - bias, E.const(0.0, x.dtype)))


def _hard_sigmoid(x: E.Expr, alpha: float, beta: float) -> E.Expr:
    return E.max_expr(E.min_expr(x * alpha + beta, 1.0), 0.0)


def _selu(x: E.Expr, alpha: float, gamma: float) -> E.Expr:
    return E.select(x > 0.0, x * gamma, (E.exp(x) - 1.0) * (alpha * gamma))


def _celu(x: E.Expr, alpha: float) -> E.Expr:
    return E.max_expr(x, 0.0) + E.min_expr((E.exp(x * (1.0 / alpha)) - 1.0) * alpha, 0.0)


def _softplus(x: E.Expr) -> E.Expr:
    """log(1 + exp(x)) without overflow, as max(x, 0) + log1p(exp(-|x|)); log1p(u) = u log(w) / (w - 1) with
    w = 1 + u (exact where w rounds to 1: there it is u), so softplus(-20) is 2e-9, not 0."""
    u = E.exp(-E.absolute(x))
    w = u + 1.0
    return E.max_expr(x, 0.0) + E.select(E.eq(w, 1.0), u, E.log(w) * u / (w - 1.0))


def _gelu(x: E.Expr, args: Args) -> E.Expr:
    approximate = args.attr("approximate")
    if approximate == "none":
        return x * 0.5 * (E.erf(x * (1.0 / math.sqrt(2.0))) + 1.0)
    if approximate == "tanh":
        return x * 0.5 * (E.tanh((x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)) + 1.0)
    raise args.error(f"approximate={approximate!r} is not 'none' or 'tanh'")


def _unary(node: Node, args: Args) -> list[Tensor]:
    fn = UNARY[node.op][0]
    x = operand(args, 0, args.value(0).dtype)
    return _pointwise(args, lambda idx: fn(x(idx), args))


for _op, (_fn, _dtypes) in UNARY.items():
    lowering(_op, kind="elemwise", dtypes=_dtypes)(_unary)


@lowering("Clip", kind="elemwise")
def _clip(node: Node, args: Args) -> list[Tensor]:
    """Infinite bounds (an omitted min or max) are dropped."""
    dtype = args.value(0).dtype
    x = operand(args, 0, dtype)
    low, high = float(args.attr("min")), float(args.attr("max"))  # min > max gives max everywhere, as in NumPy

    def body(idx):
        v = x(idx)
        if math.isfinite(low):
            v = E.max_expr(v, args.literal(math.ceil(low) if not E.is_float(dtype) else low, dtype))
        if math.isfinite(high):
            v = E.min_expr(v, args.literal(math.floor(high) if not E.is_float(dtype) else high, dtype))
        return v

    return _pointwise(args, body)


@lowering("Cast", kind="elemwise", dtypes=CASTABLE, reads=CASTABLE)
def _cast(node: Node, args: Args) -> list[Tensor]:
    """To bool: non-zero is true (a C conversion to its one byte would truncate 0.5 to 0)."""
    x = args.tensor(0)
    to = args.attr("to")
    if to != args.out(0).dtype:
        raise args.error(f"to={to!r} disagrees with the output dtype {args.out(0).dtype}")
    if to == "bool" and x.dtype != "bool":
        return _pointwise(args, lambda idx: E.ne(x[idx], E.const(0, x.dtype)))
    return _pointwise(args, lambda idx: E.cast(x[idx], to))


def _trunc_div(a: E.Expr, b: E.Expr) -> E.Expr:
    """Integer division rounding toward zero (ONNX, C), from floor division."""
    q = a // b
    inexact_negative = E.all_of(E.ne(a % b, 0), E.ne(a < 0, b < 0))
    return E.select(inexact_negative, q + 1, q)


BINARY: dict[str, Callable[[E.Expr, E.Expr], E.Expr]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a / b if E.is_float(a.dtype) else _trunc_div(a, b),
    "Max": E.max_expr,
    "Min": E.min_expr,
    "Sum": lambda a, b: a + b,
    "Mean": lambda a, b: a + b,  # then times 1 / the count
    "PRelu": lambda x, slope: E.select(x < 0, x * slope, x),
}
VARIADIC = ("Max", "Min", "Sum", "Mean")


@lowering(*(op for op in BINARY if op != "Mean"), kind="elemwise")
@lowering("Mean", kind="elemwise", dtypes=FLOATS)
def _binary(node: Node, args: Args) -> list[Tensor]:
    """Broadcasting arithmetic; Max, Min, Sum and Mean take any number of inputs."""
    dtype = args.out(0).dtype
    fn = BINARY[node.op]
    ops = [operand(args, i, dtype) for i in range(len(node.inputs))]
    if not ops or (node.op not in VARIADIC and len(ops) != 2):
        raise args.error(f"expects {'at least one input' if node.op in VARIADIC else 'two inputs'}, "
                         f"got {len(ops)}")
    scale = 1.0 / len(ops) if node.op == "Mean" else 1.0

    def body(idx):
        value = reduce(fn, (op(idx) for op in ops))
        return value * scale if scale != 1.0 else value

    return _pointwise(args, body)


COMPARE = {"Equal": "eq", "Less": "lt", "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge"}
LOGIC: dict[str, Callable[..., E.Expr]] = {"And": E.all_of, "Or": E.any_of, "Xor": E.ne, "Not": E.logical_not}


@lowering(*COMPARE, kind="elemwise", dtypes=("bool",))
def _compare(node: Node, args: Args) -> list[Tensor]:
    """Comparisons at run time (masks: `x > 0`, `ids == pad`), a bool output."""
    dtype = args.value(0).dtype
    a, b = operand(args, 0, dtype), operand(args, 1, dtype)
    return _pointwise(args, lambda idx: E.cmp(COMPARE[node.op], a(idx), b(idx)))


@lowering(*LOGIC, kind="elemwise", dtypes=("bool",))
def _logic(node: Node, args: Args) -> list[Tensor]:
    ops = [operand(args, i, "bool") for i in range(len(node.inputs))]
    return _pointwise(args, lambda idx: LOGIC[node.op](*(op(idx) for op in ops)))


PREDICATES: dict[str, Callable[[E.Expr, Args], E.Expr]] = {
    "IsNaN": lambda x, a: E.ne(x, x),
    "IsInf": lambda x, a: _is_inf(x, bool(a.attr("detect_positive")), bool(a.attr("detect_negative"))),
}


def _is_inf(x: E.Expr, positive: bool, negative: bool) -> E.Expr:
    if positive and negative:
        return E.eq(E.absolute(x), math.inf)
    return E.eq(x, math.inf if positive else -math.inf) if positive or negative else E.const(False)


@lowering(*PREDICATES, kind="elemwise", dtypes=("bool",))
def _predicate(node: Node, args: Args) -> list[Tensor]:
    """A test of each float element: NaN (x != x; kernels are built without -ffast-math), an infinity."""
    x = operand(args, 0, args.value(0).dtype)
    return _pointwise(args, lambda idx: PREDICATES[node.op](x(idx), args))


@lowering("Mod", kind="elemwise")
def _mod(node: Node, args: Args) -> list[Tensor]:
    """fmod=1: C's remainder, the sign of the dividend; fmod=0: the sign of the divisor (Python's %, floats too)."""
    dtype = args.out(0).dtype
    a, b = operand(args, 0, dtype), operand(args, 1, dtype)
    c_style = bool(args.attr("fmod"))

    def body(idx):
        x, y = a(idx), b(idx)
        if not E.is_float(dtype):
            return x - _trunc_div(x, y) * y if c_style else x % y
        rem = E.fmod(x, y)
        return rem if c_style else E.select(E.all_of(E.ne(rem, 0), E.ne(rem < 0, y < 0)), rem + y, rem)

    return _pointwise(args, body)


@lowering("Pow", kind="elemwise")
def _pow(node: Node, args: Args) -> list[Tensor]:
    """Exponents 1, 2 and 0.5 are specialized; integer bases go through float64 pow."""
    dtype = args.out(0).dtype
    base = operand(args, 0, dtype)
    exponent = args.scalar(1)
    special = {1: lambda x: x, 2: lambda x: x * x, 0.5: lambda x: E.cast(E.sqrt(x), x.dtype)}
    if exponent in special:
        return _pointwise(args, lambda idx: special[exponent](base(idx)))
    work = dtype if E.is_float(dtype) else "float64"
    power = operand(args, 1, args.value(1).dtype)
    return _pointwise(args, lambda idx: E.power(E.cast(base(idx), work), E.cast(power(idx), work)))


@lowering("Where", kind="elemwise", dtypes=READABLE)
def _where(node: Node, args: Args) -> list[Tensor]:
    """The condition may be bool, or an integer (non-zero is true)."""
    dtype = args.out(0).dtype
    cond, x, y = args.tensor(0), operand(args, 1, dtype), operand(args, 2, dtype)

    def body(idx):
        c = broadcast_load(cond, idx)
        return E.select(c if c.dtype == "bool" else E.ne(c, 0), x(idx), y(idx))

    return _pointwise(args, body)


@lowering("BatchNormalization", kind="elemwise", dtypes=FLOATS)
def _batch_norm(node: Node, args: Args) -> list[Tensor]:
    """Inference form: per-channel scale and shift stages, then one multiply-add per element."""
    if len([o for o in node.outputs if o]) != 1:
        raise args.error("only the inference form (one output) is supported")
    x, gamma, beta, mean, var = (args.tensor(i) for i in range(5))
    return [batch_norm(x, mean, var, gamma, beta, axis=1, epsilon=float(args.attr("epsilon")), name=args.name())]
