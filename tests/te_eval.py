"""A vectorised NumPy interpreter of tensor-expression graphs: a second oracle for the tests.

Each compute stage is evaluated over its whole index grid at once: spatial axes and reduction
axes become broadcastable `arange`s (reduction axes as extra trailing dimensions, reduced at the
end). Both branches of a `select` are evaluated and picked with `np.where`; loads inside a branch
(or a masked reduction) clip their indices, loads anywhere else must be in bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tensorgen.te.expr import BinOp, Call, Cast, Cmp, Const, Expr, Load, Logic, Reduce, Select, Var
from tensorgen.te.tensor import Tensor, identity_element

_BIN = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "floordiv": np.floor_divide, "floormod": np.mod, "min": np.minimum, "max": np.maximum,
}
_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
        "ne": np.not_equal}
_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}
_COMBINE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
_ERF = np.frompyfunc(math.erf, 1, 1)
_CALL = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh,
    "erf": lambda x: _ERF(x).astype(x.dtype), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "pow": np.power, "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "round": np.round, "trunc": np.trunc,
    "fmod": np.fmod,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
}


class EvalError(Exception):
    """The graph cannot be evaluated (missing feed, wrong shape, out-of-bounds load)."""


def evaluate(outputs: Sequence[Tensor], feed: dict[Tensor, np.ndarray]) -> list[np.ndarray]:
    """Values of `outputs`, given an array for every placeholder they depend on."""
    ev = _Evaluator(feed)
    with np.errstate(all="ignore"):  # untaken select branches may overflow or divide by zero
        return [ev.tensor(t).copy() for t in outputs]


class _Evaluator:
    def __init__(self, feed: dict[Tensor, np.ndarray]):
        self.values: dict[Tensor, np.ndarray] = {}
        for t, value in feed.items():
            arr = np.asarray(value)
            if arr.shape != t.shape:
                raise EvalError(f"fed {t.name} an array of shape {arr.shape}, expected {t.shape}")
            self.values[t] = arr.astype(t.dtype, copy=False)

    def tensor(self, t: Tensor) -> np.ndarray:
        if t in self.values:
            return self.values[t]
        if t.is_placeholder:
            raise EvalError(f"no value fed for placeholder {t.name}{list(t.shape)}")
        body = t.body
        red = body.axes if isinstance(body, Reduce) else ()
        extents = t.shape + tuple(r.extent for r in red)
        env: dict[Var, np.ndarray] = {}
        for d, (ax, n) in enumerate(zip(t.axes + red, extents)):
            shape = [1] * len(extents)
            shape[d] = n
            env[ax] = np.arange(n, dtype=np.int64).reshape(shape)
        memo: dict[tuple[int, bool], np.ndarray] = {}
        if isinstance(body, Reduce):
            result = self.reduce(body, env, extents, t.ndim, memo)
        else:
            result = np.broadcast_to(self.expr(body, env, False, memo), t.shape)
        out = np.ascontiguousarray(result, dtype=t.dtype)
        self.values[t] = out
        return out

    def reduce(self, body: Reduce, env, extents, ndim: int, memo) -> np.ndarray:
        masked = body.condition is not None
        src = np.broadcast_to(self.expr(body.source, env, masked, memo), extents).astype(body.dtype)
        if masked:
            mask = np.broadcast_to(self.expr(body.condition, env, False, memo), extents)
            src = np.where(mask, src, identity_element(body.combiner, body.dtype).value)
        result = _REDUCE[body.combiner](src, axis=tuple(range(ndim, len(extents))))
        if body.init is not None:
            init = np.asarray(self.expr(body.init, env, False, memo))
            init = init.reshape(init.shape[:ndim]) if init.ndim else init
            result = _COMBINE[body.combiner](init, result)
        return result

    def expr(self, e: Expr, env, guarded: bool, memo) -> np.ndarray:
        key = (id(e), guarded)
        if key not in memo:
            memo[key] = self._expr(e, env, guarded, memo)
        return memo[key]

    def _expr(self, e: Expr, env, guarded: bool, memo):
        def ev(x: Expr, g: bool = guarded):
            return self.expr(x, env, g, memo)

        if isinstance(e, Const):
            return np.array(e.value, dtype=e.dtype)
        if isinstance(e, Var):
            if e not in env:
                raise EvalError(f"variable {e.name} is not bound here")
            return env[e]
        if isinstance(e, BinOp):
            return _BIN[e.op](ev(e.a), ev(e.b)).astype(e.dtype, copy=False)
        if isinstance(e, Cmp):
            return _CMP[e.op](ev(e.a), ev(e.b))
        if isinstance(e, Logic):
            args = [ev(a) for a in e.args]
            if e.op == "not":
                return np.logical_not(args[0])
            fn = np.logical_and if e.op == "and" else np.logical_or
            out = args[0]
            for a in args[1:]:
                out = fn(out, a)
            return out
        if isinstance(e, Select):
            return np.where(ev(e.cond), ev(e.true_value, True), ev(e.false_value, True)).astype(e.dtype)
        if isinstance(e, Cast):
            value = ev(e.value)
            return value != 0 if e.dtype == "bool" else value.astype(e.dtype)
        if isinstance(e, Call):
            return np.asarray(_CALL[e.name](*[ev(a) for a in e.args])).astype(e.dtype, copy=False)
        if isinstance(e, Load):
            return self.load(e, [ev(i) for i in e.indices], guarded)
        raise EvalError(f"cannot evaluate {type(e).__name__} nodes here: {e}")

    def load(self, e: Load, indices: list[np.ndarray], guarded: bool) -> np.ndarray:
        arr = self.tensor(e.tensor)
        idx = []
        for d, (i, n) in enumerate(zip(indices, e.tensor.shape)):
            i = np.asarray(i, dtype=np.int64)
            if guarded:
                i = np.clip(i, 0, n - 1)
            elif i.size and (i.min() < 0 or i.max() >= n):
                raise EvalError(
                    f"load {e} reads dimension {d} of {e.tensor.name} at [{i.min()}, {i.max()}], "
                    f"outside [0, {n})"
                )
            idx.append(i)
        return arr[tuple(idx)]
