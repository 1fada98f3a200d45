"""Tensor expressions: the language operators and subgraphs are written in."""

from tensorgen.errors import TensorExprError
from tensorgen.te.expr import (
    BinOp,
    Call,
    Cast,
    Cmp,
    Const,
    Expr,
    Load,
    Logic,
    Reduce,
    Select,
    Var,
    absolute,
    all_of,
    any_of,
    cast,
    ceil,
    const,
    eq,
    erf,
    exp,
    floor,
    log,
    logical_not,
    max_expr,
    min_expr,
    ne,
    power,
    rsqrt,
    select,
    sigmoid,
    sqrt,
    tanh,
)
from tensorgen.te.tensor import Tensor, compute, max, min, placeholder, prod, reduce_axis, sum  # noqa: A004

__all__ = [
    "BinOp", "Call", "Cast", "Cmp", "Const", "Expr", "Load", "Logic", "Reduce", "Select", "Tensor",
    "TensorExprError", "Var", "absolute", "all_of", "any_of", "cast", "ceil", "compute", "const", "eq",
    "erf", "exp", "floor", "log", "logical_not", "max", "max_expr", "min", "min_expr", "ne", "placeholder",
    "power", "prod", "reduce_axis", "rsqrt", "select", "sigmoid", "sqrt", "sum", "tanh",
]
