"""Bound inference: the region of a producer that a consumer needs inside one of its loops.

Loop variables outside the attach point are fixed (symbolic); those inside range over their
extents. Access indices are affine in the loop variables in practice, so the region is a symbolic
minimum plus a constant extent, which is what a local buffer needs.
"""

from __future__ import annotations

from tensorgen.loopir.simplify import Ranges, from_linear, linear, simplify
from tensorgen.te.expr import BinOp, Const, Expr, Var, free_vars

Interval = tuple[Expr, int]  # (symbolic minimum, constant extent)


def interval(e: Expr, free: dict[Var, int], ranges: Ranges) -> Interval | None:
    """Range of `e` when the `free` variables sweep [0, extent) and all others are fixed."""
    terms, c = linear(simplify(e, ranges))
    fixed: dict[Expr, int] = {}
    ext = 1
    for atom, coef in terms.items():
        if not (free_vars(atom) & free.keys()):
            fixed[atom] = fixed.get(atom, 0) + coef
            continue
        if isinstance(atom, Var):
            sub: Interval | None = (Const(0, "int32"), free[atom])
        else:
            sub = _divmod_interval(atom, free, ranges)
        if sub is None:
            return None
        lo, n = sub
        for a, k in linear(lo)[0].items():
            fixed[a] = fixed.get(a, 0) + k * coef
        c += linear(lo)[1] * coef
        if coef < 0:
            c += coef * (n - 1)
        ext += abs(coef) * (n - 1)
    return from_linear({a: k for a, k in fixed.items() if k}, c), ext


def _divmod_interval(atom: Expr, free: dict[Var, int], ranges: Ranges) -> Interval | None:
    if not (isinstance(atom, BinOp) and atom.op in ("floordiv", "floormod") and isinstance(atom.b, Const)):
        return None
    k = int(atom.b.value)
    sub = interval(atom.a, free, ranges)
    if sub is None or k <= 0:
        return None
    lo, n = sub
    terms, m0 = linear(lo)
    aligned = all(v % k == 0 for v in terms.values())
    if atom.op == "floordiv":
        if aligned:
            q = from_linear({a: v // k for a, v in terms.items()}, m0 // k)
            return q, (m0 % k + n - 1) // k + 1
        return simplify(lo // k, ranges), (n - 1) // k + 2
    if aligned and m0 % k + n <= k:
        return Const(m0 % k, "int32"), n
    return Const(0, "int32"), k


def union(intervals: list[Interval]) -> Interval | None:
    """Union of intervals whose minima differ by constants; None when they are incomparable."""
    base_terms = linear(intervals[0][0])[0]
    lows, highs = [], []
    for lo, n in intervals:
        terms, c = linear(lo)
        if terms != base_terms:
            return None
        lows.append(c)
        highs.append(c + n)
    return from_linear(base_terms, min(lows)), max(highs) - min(lows)
