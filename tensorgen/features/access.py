"""Memory-access analysis of one statement: per-loop strides of flat indices, and the footprint model
(computed by `features.ansor` for many statements at once).

Flat indices are linear in the loop variables after lowering's simplification, so the stride of an
access wrt a loop is its coefficient in `linear(index)`. Non-affine atoms (`f // 16` from fused
loops) get the *average* slope over the loop's range, evaluated with the other variables at zero.

Unique elements touched by one access under a set of loops (the footprint) is approximated as
`min(sum_j |c_j| * (e_j - 1) + 1, prod_{j: c_j != 0} e_j)`: the span of the index when strides
overlap (convolution windows, c=1 on two loops) and the point count when they do not (tiles).
Both are exact for a single loop and for non-overlapping row-major tiles; the span overcounts
strided tiles with gaps, the product undercounts nothing. Results are capped by the buffer size.
`window_footprints` also merges loops whose strides overlap on a lattice (a convolution's output and
window loops along one dimension: `w * 2 + rw` touches 2 * 27 + 3 elements, not 28 * 3): the static
analyzer's memory term uses it; the features keep the simpler count the shipped models were trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensorgen.loopir.nodes import Buffer
from tensorgen.loopir.simplify import linear
from tensorgen.te.expr import BinOp, Const, Expr, Var, walk


@dataclass
class Access:
    """One load or store of a statement: its buffer, write flag and per-loop coefficient vector."""

    buffer: Buffer
    write: bool
    coef: np.ndarray  # |stride| in elements wrt each enclosing loop, outer to inner
    offset: int


def footprints(coef: np.ndarray, ext: np.ndarray) -> np.ndarray:
    """Unique elements each access touches under each loop level (the module docstring's approximation, not capped
    by the buffer): `coef` (..., A, L) strides, `ext` (..., L) extents; the result is (..., A, L + 1), level L
    being one execution of the statement (1 element)."""
    e = ext[..., None, :]
    span = np.cumsum((coef * (e - 1))[..., ::-1], axis=-1)[..., ::-1] + 1
    points = np.cumprod(np.where(coef > 0, e, 1.0)[..., ::-1], axis=-1)[..., ::-1]
    return np.concatenate([np.minimum(span, points), np.ones(coef.shape[:-1] + (1,))], axis=-1)


def window_footprints(coef: np.ndarray, ext: np.ndarray) -> np.ndarray:
    """`footprints` with loops along one dimension merged: the moving loops of each level in ascending stride, a
    loop whose stride is a whole multiple k of the current dimension's stride, with k at most the points that
    dimension spans so far, extends it by k * (extent - 1) points; any other starts a new dimension (the count is
    the product of the dimensions', capped by the span and by the count of every level around it: a loop that
    merges strides the ones inside it could not, 2 and 3 through 1, makes the outer count the closer one)."""
    e = np.broadcast_to(ext[..., None, :], coef.shape)
    L = coef.shape[-1]
    order = np.argsort(np.where((coef > 0) & (e > 1), coef, np.inf), axis=-1, kind="stable")
    c, n = np.take_along_axis(coef, order, -1)[..., None], np.take_along_axis(e, order, -1)[..., None]
    moving = (c > 0) & (n > 1) & (order[..., None] >= np.arange(L + 1))  # (..., k, level): loop k is in the level
    done, stride, points = (np.ones(coef.shape[:-1] + (L + 1,)) for _ in range(3))  # per level
    for k in range(L):
        ratio = c[..., k, :] / stride
        merge = moving[..., k, :] & (np.abs(ratio - np.round(ratio)) < 1e-6) & (ratio <= points)
        new = moving[..., k, :] & ~merge
        done = np.where(new, done * points, done)
        points = np.where(merge, points + ratio * (n[..., k, :] - 1), np.where(new, n[..., k, :], points))
        stride = np.where(new, c[..., k, :], stride)
    return np.minimum.accumulate(np.minimum(footprints(coef, ext), done * points), axis=-1)


def coefficients(index: Expr, loop_vars: list[Var], extents: np.ndarray) -> tuple[np.ndarray, int]:
    """|d index / d loop_var| for each loop (in elements) and the constant part of `index`."""
    terms, c = linear(index)
    pos = {id(v): k for k, v in enumerate(loop_vars)}
    coef = np.zeros(len(loop_vars))
    for atom, a in terms.items():
        k = pos.get(id(atom))
        if k is not None:
            coef[k] += abs(a)
            continue
        for v in {id(n): n for n in walk(atom) if isinstance(n, Var)}.values():
            j = pos.get(id(v))
            if j is None or extents[j] <= 1:
                continue
            hi = _eval(atom, {id(v): int(extents[j]) - 1})
            lo = _eval(atom, {})
            if hi is not None and lo is not None:
                coef[j] += abs(a * (hi - lo)) / (extents[j] - 1)
    return coef, c


def _eval(e: Expr, env: dict[int, int]) -> int | None:
    """Integer value of index expression `e`; loop variables not in `env` are 0."""
    if isinstance(e, Var):
        return env.get(id(e), 0)
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, BinOp):
        a, b = _eval(e.a, env), _eval(e.b, env)
        if a is None or b is None:
            return None
        if e.op in ("floordiv", "floormod") and b == 0:
            return None
        fn = {"add": a.__add__, "sub": a.__sub__, "mul": a.__mul__, "floordiv": a.__floordiv__,
              "floormod": a.__mod__, "min": lambda x: min(a, x), "max": lambda x: max(a, x)}.get(e.op)
        return None if fn is None else fn(b)
    return None
