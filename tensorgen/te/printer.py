"""Readable printing of expressions; with a renaming map it is also the canonical form."""

from __future__ import annotations

from collections.abc import Callable

from tensorgen.te.expr import BinOp, Call, Cast, Cmp, Const, Expr, Load, Logic, Reduce, Select, Var, is_float

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
