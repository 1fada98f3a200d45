"""Memory-access analysis of one statement: per-loop strides of flat indices and footprint estimates.

Flat indices are linear in the loop variables after lowering's simplification, so the stride of an
access wrt a loop is its coefficient in `linear(index)`. Non-affine atoms (`f // 16` from fused
loops) get the *average* slope over the loop's range, evaluated with the other variables at zero.

Unique elements touched by one access under a set of loops (the footprint) is approximated as
`min(sum_j |c_j| * (e_j - 1) + 1, prod_{j: c_j != 0} e_j)`: the span of the index when strides
overlap (convolution windows, c=1 on two loops) and the point count when they do not (tiles).
Both are exact for a single loop and for non-overlapping row-major tiles; the span overcounts
strided tiles with gaps, the product undercounts nothing. Results are capped by the buffer size.
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


def footprints(coefs: np.ndarray, extents: np.ndarray) -> np.ndarray:
    """Unique elements touched under loops k..n-1, for k = 0..n (entry n: the statement alone = 1),
    one row per access of the (n_accesses, n) stride stack `coefs`."""
    n = len(extents)
    span = np.ones((len(coefs), n + 1))
    prod = np.ones((len(coefs), n + 1))
    if n:
        span[:, :n] = np.cumsum((coefs * (extents - 1))[:, ::-1], axis=1)[:, ::-1] + 1
        prod[:, :n] = np.cumprod(np.where(coefs > 0, extents, 1)[:, ::-1], axis=1)[:, ::-1]
    return np.minimum(span, prod)


@dataclass
class BufferStats:
    """What one statement does to one buffer, before log scaling."""

    buffer: Buffer
    reads: int
    writes: int
    bytes: float
    unique: np.ndarray  # unique bytes under loops k.., k = 0..n
    lines: float
    unique_lines: float
    stride: float
    coefs: np.ndarray  # (n_accesses, n) strides of its accesses


def buffer_stats(accesses: list[Access], extents: np.ndarray, trip: float, line_bytes: int) -> list[BufferStats]:
    """Group a statement's accesses by buffer and estimate bytes, footprint, cache lines and stride.

    Per-access quantities are computed for the whole statement at once (one (n_accesses, n) array),
    then summed per buffer: this runs for every candidate the search scores.
    """
    n = len(extents)
    coefs = np.array([a.coef for a in accesses]).reshape(len(accesses), n)
    fps = footprints(coefs, extents)
    nz = coefs != 0
    moving = nz.any(axis=1)
    # innermost loop that moves each access, and its stride
    inner = n - 1 - np.argmax(nz[:, ::-1], axis=1) if n else np.zeros(len(accesses), dtype=int)
    stride = np.where(moving, coefs[np.arange(len(accesses)), inner], 0.0) if n else np.zeros(len(accesses))
    suffix = np.ones(n + 1)  # product of extents inside loop k (loops that re-hit the same element)
    if n:
        suffix[:n] = np.cumprod(extents[::-1])[::-1]
    smallest = np.where(nz, coefs, np.inf).min(axis=1) if n else np.full(len(accesses), np.inf)
    groups: dict[str, list[int]] = {}
    for k, a in enumerate(accesses):
        groups.setdefault(a.buffer.name, []).append(k)
    out = []
    for idx in groups.values():
        buf = accesses[idx[0]].buffer
        eb = buf.nbytes / max(buf.size, 1)
        rows = coefs[idx]
        if len(idx) == 1 or (rows == rows[0]).all():
            # shifted copies of one pattern (stencils, read-modify-write): one footprint plus the shift
            offs = [accesses[k].offset for k in idx]
            elems = np.minimum(fps[idx[0]] + (max(offs) - min(offs)), fps[idx].sum(axis=0))
        else:
            elems = fps[idx].sum(axis=0)
        elems = np.minimum(elems, buf.size)
        per_line = np.minimum(1.0, stride[idx] * eb / line_bytes)
        lines = float(np.where(moving[idx], trip / suffix[np.minimum(inner[idx] + 1, n)] * per_line, 1.0).sum())
        smin = float(smallest[idx].min())
        # dense footprints share lines (elements per line = line / (smallest stride * elem bytes))
        unique_lines = 1.0 if smin == np.inf else max(1.0, elems[0] * min(line_bytes, smin * eb) / line_bytes)
        writes = sum(accesses[k].write for k in idx)
        out.append(BufferStats(buf, len(idx) - writes, writes, len(idx) * trip * eb, elems * eb, lines,
                               unique_lines, float(stride[idx].max()), rows))
    return out
