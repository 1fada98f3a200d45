"""Immutable, hashable expression nodes for tensor expressions and index arithmetic.

Structural equality (`==`) compares trees; comparisons `<, <=, >, >=` build `Cmp` nodes,
and equality tests inside expressions are written `eq(a, b)` / `ne(a, b)`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Union

from tensorgen.errors import TensorExprError

if TYPE_CHECKING:
    from tensorgen.te.tensor import Tensor

FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int32", "int64")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
DTYPE_BYTES = {"float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1}
BINARY_OPS = ("add", "sub", "mul", "div", "floordiv", "floormod", "min", "max")
CMP_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
INTRINSICS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "pow", "abs", "floor", "ceil", "round", "trunc",
              "fmod", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")
COMBINERS = ("sum", "max", "min", "prod")

ExprLike = Union["Expr", int, float, bool]


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise TensorExprError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return dtype


def promote(a: str, b: str) -> str:
    """Result dtype of a binary op: float beats int, wider beats narrower."""
    if a == b:
        return a
    if is_float(a) != is_float(b):
        return a if is_float(a) else b
    order = DTYPES
    return a if order.index(a) > order.index(b) else b


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


class Expr:
    """Base of all expression nodes: operator overloading and generic traversal."""

    dtype: str
    _kids: tuple[str, ...] = ()

    def children(self) -> Iterator[Expr]:
        for name in self._kids:
            value = getattr(self, name)
            if isinstance(value, tuple):
                yield from value
            elif value is not None:
                yield value

    def with_children(self, fn: Callable[[Expr], Expr]) -> Expr:
        """Rebuild this node with `fn` applied to every direct child (self if nothing changed)."""
        changes = {}
        for name in self._kids:
            value = getattr(self, name)
            if isinstance(value, tuple):
                new = tuple(fn(v) for v in value)
                if any(n is not v for n, v in zip(new, value)):
                    changes[name] = new
            elif value is not None:
                new = fn(value)
                if new is not value:
                    changes[name] = new
        if not changes:
            return self
        kw = {name: getattr(self, name) for name in _field_names(type(self))}
        kw.update(changes)
        return type(self)(**kw)

    def __add__(self, o: ExprLike) -> Expr:
        return binop("add", self, o)

    def __radd__(self, o: ExprLike) -> Expr:
        return binop("add", o, self)

    def __sub__(self, o: ExprLike) -> Expr:
        return binop("sub", self, o)

    def __rsub__(self, o: ExprLike) -> Expr:
        return binop("sub", o, self)

    def __mul__(self, o: ExprLike) -> Expr:
        return binop("mul", self, o)

    def __rmul__(self, o: ExprLike) -> Expr:
        return binop("mul", o, self)

    def __truediv__(self, o: ExprLike) -> Expr:
        return binop("div", self, o)

    def __rtruediv__(self, o: ExprLike) -> Expr:
        return binop("div", o, self)

    def __floordiv__(self, o: ExprLike) -> Expr:
        return binop("floordiv", self, o)

    def __rfloordiv__(self, o: ExprLike) -> Expr:
        return binop("floordiv", o, self)

    def __mod__(self, o: ExprLike) -> Expr:
        return binop("floormod", self, o)

    def __rmod__(self, o: ExprLike) -> Expr:
        return binop("floormod", o, self)

    def __neg__(self) -> Expr:
        """-x: for floats x * -1, which flips the sign of a zero too (0 - x makes -0.0 into +0.0)."""
        if is_float(self.dtype):
            return binop("mul", self, const(-1.0, self.dtype))
        return binop("sub", const(0, self.dtype), self)

    def __lt__(self, o: ExprLike) -> Expr:
        return cmp("lt", self, o)

    def __le__(self, o: ExprLike) -> Expr:
        return cmp("le", self, o)

    def __gt__(self, o: ExprLike) -> Expr:
        return cmp("gt", self, o)

    def __ge__(self, o: ExprLike) -> Expr:
        return cmp("ge", self, o)

    def __bool__(self) -> bool:
        raise TensorExprError(
            "a tensor expression has no truth value; use te.select(cond, a, b) instead of `if`, "
            "te.all_of/any_of instead of `and`/`or`"
        )

    def __str__(self) -> str:
        return expr_str(self)


@dataclass(frozen=True, repr=False)
class Const(Expr):
    value: int | float
    dtype: str = "int32"

    __repr__ = Expr.__str__


@dataclass(frozen=True, eq=False, repr=False)
class Var(Expr):
    """A variable; identity matters (two Vars named `i` are different). Axes carry an extent."""

    name: str
    dtype: str = "int32"
    extent: int | None = None
    reduce: bool = False

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, repr=False)
class BinOp(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: str
    _kids = ("a", "b")
    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Cmp(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: str = "bool"
    _kids = ("a", "b")
    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Logic(Expr):
    op: str  # and | or | not
    args: tuple[Expr, ...]
    dtype: str = "bool"
    _kids = ("args",)
    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Select(Expr):
    cond: Expr
    true_value: Expr
    false_value: Expr
    dtype: str
    _kids = ("cond", "true_value", "false_value")
    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Cast(Expr):
    dtype: str
    value: Expr
    _kids = ("value",)
    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Call(Expr):
    name: str
    args: tuple[Expr, ...]
    dtype: str
    _kids = ("args",)
    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Load(Expr):
    tensor: Tensor
    indices: tuple[Expr, ...]
    dtype: str
    _kids = ("indices",)
    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Reduce(Expr):
    """`combiner` over `axes` of `source`, where `condition` holds, starting from `init`."""

    combiner: str
    source: Expr
    axes: tuple[Var, ...]
    condition: Expr | None
    init: Expr | None
    dtype: str
    _kids = ("source", "condition", "init")
    __repr__ = Expr.__str__


# ---------------------------------------------------------------------------------------------
# construction helpers


def const(value: int | float | bool, dtype: str | None = None) -> Const:
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else "int32" if isinstance(value, int) else "float32"
    check_dtype(dtype)
    if is_float(dtype):
        value = float(value)
    elif dtype != "bool":
        if isinstance(value, float) and not value.is_integer():
            raise TensorExprError(f"cannot make an {dtype} constant from {value}")
        value = int(value)
    return Const(value, dtype)


def as_expr(value: ExprLike, like: str | None = None) -> Expr:
    """Wrap a Python number; `like` is the dtype of the other operand, so `x * 0.5` stays float32."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return const(value, "bool")
    if isinstance(value, int):
        return const(value, like if like and like != "bool" else "int32")
    if isinstance(value, float):
        return const(value, like if like and is_float(like) else "float32")
    raise TensorExprError(f"cannot use {value!r} of type {type(value).__name__} in a tensor expression")


def _operands(a: ExprLike, b: ExprLike) -> tuple[Expr, Expr]:
    if isinstance(a, Expr) or not isinstance(b, Expr):
        ea = as_expr(a)
        return ea, as_expr(b, ea.dtype)
    eb = as_expr(b)
    return as_expr(a, eb.dtype), eb


def binop(op: str, a: ExprLike, b: ExprLike) -> Expr:
    ea, eb = _operands(a, b)
    dtype = promote(ea.dtype, eb.dtype)
    if op == "div" and not is_float(dtype):
        raise TensorExprError(f"`/` on integers ({ea} / {eb}) is ambiguous; use `//` (floor division)")
    if op in ("floordiv", "floormod") and is_float(dtype):
        raise TensorExprError(f"`{op}` needs integer operands, got {ea.dtype} and {eb.dtype}")
    if isinstance(ea, Const) and isinstance(eb, Const) and dtype != "bool":
        folded = _fold(op, ea.value, eb.value)
        if folded is not None:
            return const(folded, dtype)
    return BinOp(op, ea, eb, dtype)


def _fold(op: str, a, b):
    if op in ("div", "floordiv", "floormod") and b == 0:
        return None
    return {
        "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "div": lambda: a / b,
        "floordiv": lambda: a // b, "floormod": lambda: a % b, "min": lambda: min(a, b),
        "max": lambda: max(a, b),
    }[op]()


def cmp(op: str, a: ExprLike, b: ExprLike) -> Expr:
    ea, eb = _operands(a, b)
    return Cmp(op, ea, eb)


def eq(a: ExprLike, b: ExprLike) -> Expr:
    return cmp("eq", a, b)


def ne(a: ExprLike, b: ExprLike) -> Expr:
    return cmp("ne", a, b)


def min_expr(a: ExprLike, b: ExprLike) -> Expr:
    return binop("min", a, b)


def max_expr(a: ExprLike, b: ExprLike) -> Expr:
    return binop("max", a, b)


def as_condition(x: ExprLike) -> Expr:
    """`x` as a boolean expression; a Python bool is refused (it comes from `==` on expressions)."""
    if isinstance(x, bool):
        raise TensorExprError(
            "got a Python bool where a condition expression was expected; `a == b` on expressions is "
            "structural equality, write te.eq(a, b) / te.ne(a, b) instead"
        )
    e = as_expr(x)
    if e.dtype != "bool":
        raise TensorExprError(f"expected a condition (bool), got {e} of type {e.dtype}")
    return e


def all_of(*conds: ExprLike) -> Expr:
    return Logic("and", tuple(as_condition(c) for c in conds)) if len(conds) > 1 else as_condition(conds[0])


def any_of(*conds: ExprLike) -> Expr:
    return Logic("or", tuple(as_condition(c) for c in conds)) if len(conds) > 1 else as_condition(conds[0])


def logical_not(cond: ExprLike) -> Expr:
    return Logic("not", (as_condition(cond),))


def select(cond: ExprLike, true_value: ExprLike, false_value: ExprLike) -> Expr:
    t, f = _operands(true_value, false_value)
    dtype = promote(t.dtype, f.dtype)
    return Select(as_condition(cond), cast(t, dtype), cast(f, dtype), dtype)


def cast(value: ExprLike, dtype: str) -> Expr:
    e = as_expr(value)
    check_dtype(dtype)
    if e.dtype == dtype:
        return e
    if isinstance(e, Const):
        return const(math.trunc(e.value) if is_int(dtype) else e.value, dtype)  # C truncates too
    return Cast(dtype, e)


def call(name: str, *args: ExprLike) -> Expr:
    if name not in INTRINSICS:
        raise TensorExprError(f"unknown intrinsic {name!r}; known: {', '.join(INTRINSICS)}")
    exprs = [as_expr(a) for a in args]
    dtype = exprs[0].dtype
    for e in exprs[1:]:
        dtype = promote(dtype, e.dtype)
    if name != "abs" and not is_float(dtype):
        dtype = "float32"
    return Call(name, tuple(cast(e, dtype) for e in exprs), dtype)


def _intrinsic(name: str) -> Callable[..., Expr]:
    def fn(*args: ExprLike) -> Expr:
        return call(name, *args)

    fn.__name__ = name
    fn.__doc__ = f"The `{name}` intrinsic."
    return fn


(exp, log, sqrt, rsqrt, tanh, erf, sigmoid, power, absolute, floor, ceil, round_even, trunc, fmod,
 sin, cos, tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh) = (_intrinsic(n) for n in INTRINSICS)


# ---------------------------------------------------------------------------------------------
# traversal


def walk(expr: Expr) -> Iterator[Expr]:
    """Pre-order iteration over every node."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children())


def transform(expr: Expr, fn: Callable[[Expr], Expr | None], memo: dict | None = None) -> Expr:
    """Rebuild bottom-up; `fn(node)` may return a replacement (or None to keep the rebuilt node).

    `memo` (id -> (node, result); the node is kept alive so its id stays unique) may be shared by
    calls that apply the same `fn`, so common subtrees are rewritten once.
    """
    memo = {} if memo is None else memo

    def visit(node: Expr) -> Expr:
        hit = memo.get(id(node))
        if hit is not None:
            return hit[1]
        rebuilt = node.with_children(visit)
        out = fn(rebuilt)
        out = rebuilt if out is None else out
        memo[id(node)] = (node, out)
        return out

    return visit(expr)


def substitute(expr: Expr, mapping: dict[Var, Expr]) -> Expr:
    if not mapping:
        return expr
    return transform(expr, lambda n: mapping.get(n) if isinstance(n, Var) else None)


def free_vars(expr: Expr) -> set[Var]:
    return {n for n in walk(expr) if isinstance(n, Var)}


def loads(expr: Expr) -> list[Load]:
    return [n for n in walk(expr) if isinstance(n, Load)]


# ---- printing: readable text; with a renaming map it is also the canonical form ----------------------------

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def precedence(e: Expr) -> int:
    """Binding strength of how `e` prints: 1 for + -, 2 for * / // %, 3 for atoms and calls."""
    if isinstance(e, BinOp) and e.op in ("add", "sub"):
        return 1
    if isinstance(e, BinOp) and e.op in ("mul", "div", "floordiv", "floormod"):
        return 2
    if isinstance(e, (Cmp, Logic, Select)) or (isinstance(e, Const) and e.value < 0):
        return 0
    return 3


def infix(e: BinOp, a: str, b: str, symbol: str) -> str:
    """`a symbol b` with the parentheses precedence needs; float + and * keep their grouping. An integer
    `a + (b - c)` and `a * (b * c)` may regroup, `a * (b // c)` or `a * (b % c)` may not."""
    prec = precedence(e)
    if precedence(e.a) < prec:
        a = f"({a})"
    same = precedence(e.b) == prec  # then e.b is a BinOp of e's precedence class
    regroupable = same and not is_float(e.dtype) and (e.op == "add" or e.op == "mul" and e.b.op == "mul")
    if precedence(e.b) < prec or (same and not regroupable):
        b = f"({b})"
    return f"{a} {symbol} {b}"


def expr_str(expr: Expr, name_of: Callable[[object], str] | None = None) -> str:
    """Python-like text of `expr`; `name_of(var_or_tensor)` overrides names (for canonical keys)."""
    name = name_of or (lambda obj: obj.name)

    def p(e: Expr) -> str:
        if isinstance(e, Const):
            if e.dtype == "bool":
                return str(bool(e.value))
            text = repr(e.value)
            return text if e.dtype in ("int32", "float32") else f"{e.dtype}({text})"
        if isinstance(e, Var):
            return name(e)
        if isinstance(e, BinOp):
            if e.op in _INFIX:
                return infix(e, p(e.a), p(e.b), _INFIX[e.op])
            return f"{e.op}({p(e.a)}, {p(e.b)})"
        if isinstance(e, Cmp):
            return f"({p(e.a)} {_CMP[e.op]} {p(e.b)})"
        if isinstance(e, Logic):
            if e.op == "not":
                return f"not({p(e.args[0])})"
            return f"{e.op}({', '.join(p(a) for a in e.args)})"
        if isinstance(e, Select):
            return f"select({p(e.cond)}, {p(e.true_value)}, {p(e.false_value)})"
        if isinstance(e, Cast):
            return f"{e.dtype}({p(e.value)})"
        if isinstance(e, Call):
            return f"{e.name}({', '.join(p(a) for a in e.args)})"
        if isinstance(e, Load):
            return f"{name(e.tensor)}[{', '.join(p(i) for i in e.indices)}]"
        if isinstance(e, Reduce):
            axes = ", ".join(f"{name(a)}:{a.extent}" for a in e.axes)
            extra = "" if e.condition is None else f", where={p(e.condition)}"
            extra += "" if e.init is None else f", init={p(e.init)}"
            return f"{e.combiner}({p(e.source)}, axis=[{axes}]{extra})"
        if hasattr(e, "buffer"):  # loop-IR flat loads
            return f"{e.buffer.name}[{p(e.index)}]"
        raise TypeError(f"cannot print {type(e).__name__}")

    return p(expr)
