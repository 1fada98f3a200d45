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

import operator
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
    lanes: np.ndarray | None = None  # GPU: the index at each lane of a warp (`warp_lanes`), where not affine


#: thread axes in the order a block's threads are numbered (x fastest); a warp is `WARP` consecutive threads
THREAD_AXES = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
WARP = 32


def warp_lanes(kinds: tuple[str, ...] | np.ndarray, extents: np.ndarray, warp: int = WARP) -> np.ndarray:
    """The value of each loop (..., L) at each lane of a statement's first warp (..., L, warp): a loop bound to
    threadIdx.* takes that thread coordinate, numbered x fastest over the extents of the innermost loop bound to each
    axis (a block-stride loop's first iteration); other loops are 0. Lanes past the threads that run it repeat lane
    0."""
    kinds = np.asarray(kinds, dtype=object)
    ext = np.asarray(extents, dtype=float)
    lane = np.arange(warp)
    place = np.ones(ext.shape[:-1])
    values = np.zeros(ext.shape + (warp,))
    for axis in THREAD_AXES:
        bound = kinds == axis
        dim = np.where(bound, ext, np.inf).min(axis=-1, initial=np.inf)
        dim = np.where(np.isfinite(dim), dim, 1.0)
        coord = (lane // place[..., None]) % dim[..., None]
        values = np.where(bound[..., None], coord[..., None, :], values)
        place = place * dim
    return np.where(lane < place[..., None, None], values, values[..., :1])


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
            hi = index_values(atom, {id(v): int(extents[j]) - 1})
            lo = index_values(atom, {})
            if hi is not None and lo is not None:
                coef[j] += abs(a * (hi - lo)) / (extents[j] - 1)
    return coef, c


_INDEX_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
        "floormod": operator.mod, "min": np.minimum, "max": np.maximum}


def index_values(e: Expr, env: dict):
    """Integer value of index expression `e`, None where it is not integer arithmetic: loop variables by id in
    `env` (ints, or arrays of one shape: the values at each point), others 0."""
    if isinstance(e, Var):
        return env.get(id(e), 0)
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, BinOp):
        a, b = index_values(e.a, env), index_values(e.b, env)
        fn = _INDEX_OPS.get(e.op)
        if a is None or b is None or fn is None or (e.op in ("floordiv", "floormod") and np.any(b == 0)):
            return None
        return fn(a, b)
    return None
