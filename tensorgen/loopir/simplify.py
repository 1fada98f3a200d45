"""Integer index arithmetic: linear forms, constant bounds, and a simplifier built on both.

Lowering composes split/fuse relations with access indices, which produces expressions like
`(i_0*8 + i_1) // 8`; with loop ranges known these simplify to `i_0`, so the C has no redundant
division.
"""

from __future__ import annotations

from tensorgen.te.expr import BinOp, Cmp, Const, Expr, Logic, Select, Var, const, is_int, transform

Ranges = dict[Var, tuple[int, int]]  # inclusive [lo, hi] of each loop variable
Linear = tuple[dict[Expr, int], int]  # {atom: coefficient}, constant


def linear(e: Expr, memo: dict | None = None) -> Linear:
    """`e` as a sum of coefficient * atom + constant; non-affine parts become atoms.

    `memo` (id -> (node, result); the node is kept so its id stays unique) makes repeated calls on
    nested subtrees linear instead of quadratic; results from it are shared, callers must not mutate.
    """
    if memo is not None:
        hit = memo.get(id(e))
        if hit is not None:
            return hit[1]
        out = _linear(e, memo)
        memo[id(e)] = (e, out)
        return out
    return _linear(e, None)


def _linear(e: Expr, memo: dict | None) -> Linear:
    if isinstance(e, Const) and is_int(e.dtype):
        return {}, int(e.value)
    if isinstance(e, BinOp) and is_int(e.dtype):
        if e.op in ("add", "sub"):
            (ta, ca), (tb, cb) = linear(e.a, memo), linear(e.b, memo)
            sign = 1 if e.op == "add" else -1
            terms = dict(ta)
            for k, v in tb.items():
                terms[k] = terms.get(k, 0) + sign * v
            return {k: v for k, v in terms.items() if v}, ca + sign * cb
        if e.op == "mul":
            (ta, ca), (tb, cb) = linear(e.a, memo), linear(e.b, memo)
            if not tb:
                return ({k: v * cb for k, v in ta.items() if v * cb}, ca * cb)
            if not ta:
                return ({k: v * ca for k, v in tb.items() if v * ca}, ca * cb)
    return {e: 1}, 0


def from_linear(terms: dict[Expr, int], c: int, dtype: str = "int32") -> Expr:
    out: Expr | None = None
    for atom, coef in sorted(terms.items(), key=lambda kv: -abs(kv[1])):
        term = atom if coef in (1, -1) else atom * const(abs(coef), dtype)
        if out is None:
            out = term if coef > 0 else const(0, dtype) - term
        else:
            out = out + term if coef > 0 else out - term
    if out is None:
        return const(c, dtype)
    if c:
        out = out + const(c, dtype) if c > 0 else out - const(-c, dtype)
    return out


def bound(e: Expr, ranges: Ranges) -> tuple[int, int] | None:
    """Inclusive constant bounds of integer `e` over `ranges`, or None if unknown."""
    terms, c = linear(e)
    lo = hi = c
    for atom, coef in terms.items():
        b = _atom_bound(atom, ranges)
        if b is None:
            return None
        a, z = (b[0] * coef, b[1] * coef)
        lo, hi = lo + min(a, z), hi + max(a, z)
    return lo, hi


def _atom_bound(atom: Expr, ranges: Ranges) -> tuple[int, int] | None:
    if isinstance(atom, Var):
        if atom in ranges:
            return ranges[atom]
        return (0, atom.extent - 1) if atom.extent else None
    if isinstance(atom, BinOp) and isinstance(atom.b, Const) and atom.b.value > 0:
        c = int(atom.b.value)
        b = bound(atom.a, ranges)
        if atom.op == "floordiv":
            return None if b is None else (b[0] // c, b[1] // c)
        if atom.op == "floormod":
            if b is not None and b[0] // c == b[1] // c:
                return b[0] % c, b[1] % c
            return 0, c - 1
    if isinstance(atom, BinOp) and atom.op in ("min", "max"):
        a, b = bound(atom.a, ranges), bound(atom.b, ranges)
        if a is None or b is None:
            return None
        f = min if atom.op == "min" else max
        return f(a[0], b[0]), f(a[1], b[1])
    return None


def prove(cond: Expr, ranges: Ranges) -> bool | None:
    """True/False if `cond` holds for all / no points of `ranges`, None if it depends."""
    if isinstance(cond, Const):
        return bool(cond.value)
    if isinstance(cond, Cmp) and is_int(cond.a.dtype):
        d = bound(cond.a - cond.b, ranges)
        if d is None:
            return None
        lo, hi = d
        table = {
            "lt": (hi < 0, lo >= 0), "le": (hi <= 0, lo > 0), "gt": (lo > 0, hi <= 0),
            "ge": (lo >= 0, hi < 0), "eq": (lo == hi == 0, lo > 0 or hi < 0), "ne": (lo > 0 or hi < 0, lo == hi == 0),
        }
        always, never = table[cond.op]
        return True if always else False if never else None
    if isinstance(cond, Logic):
        parts = [prove(a, ranges) for a in cond.args]
        if cond.op == "not":
            return None if parts[0] is None else not parts[0]
        if cond.op == "and":
            return False if False in parts else True if all(p is True for p in parts) else None
        return True if True in parts else False if all(p is False for p in parts) else None
    return None


class SimplifyCache:
    """Results shared across `simplify` calls over one growing `ranges` (as in one lowering): a node's
    variables already have their ranges when it is first simplified, so its result never changes."""

    def __init__(self) -> None:
        self.nodes: dict = {}
        self.linear: dict = {}


def simplify(e: Expr, ranges: Ranges | None = None, cache: SimplifyCache | None = None) -> Expr:
    """Canonicalize integer arithmetic and drop divisions/modulos that the ranges make trivial."""
    ranges = ranges or {}
    cache = cache or SimplifyCache()
    return transform(e, lambda n: _simplify_node(n, ranges, cache.linear), cache.nodes)


def _simplify_node(n: Expr, ranges: Ranges, memo: dict) -> Expr | None:
    if isinstance(n, BinOp) and is_int(n.dtype):
        if n.op in ("floordiv", "floormod") and isinstance(n.b, Const) and n.b.value > 0:
            return _divmod(n.op, n.a, int(n.b.value), ranges)
        if n.op in ("add", "sub", "mul"):
            terms, c = linear(n, memo)
            out = from_linear(terms, c, n.dtype)
            memo[id(out)] = (out, (terms, c))
            return out
        if n.op in ("min", "max"):
            a, b = bound(n.a, ranges), bound(n.b, ranges)
            if a and b:
                if a[1] <= b[0]:  # a <= b everywhere
                    return n.a if n.op == "min" else n.b
                if b[1] <= a[0]:  # b <= a everywhere
                    return n.b if n.op == "min" else n.a
    if isinstance(n, (Cmp, Logic)):
        p = prove(n, ranges)
        if p is not None:
            return const(p, "bool")
    if isinstance(n, Select):
        p = prove(n.cond, ranges)
        if p is not None:
            return n.true_value if p else n.false_value
    return None


def _divmod(op: str, x: Expr, c: int, ranges: Ranges) -> Expr:
    """x // c or x % c, with x = c*q + r split off by coefficient divisibility."""
    if c == 1:
        return x if op == "floordiv" else const(0, x.dtype)
    terms, k = linear(x)
    q = {a: v // c for a, v in terms.items() if v % c == 0}
    r = {a: v for a, v in terms.items() if v % c != 0}
    qc, rc = k // c, k % c
    rest = from_linear(r, rc, x.dtype)
    rb = bound(rest, ranges)
    if rb is not None and 0 <= rb[0] and rb[1] < c:
        return from_linear(q, qc, x.dtype) if op == "floordiv" else rest
    xb = bound(x, ranges)
    if xb is not None and 0 <= xb[0] and xb[1] < c:
        return const(0, x.dtype) if op == "floordiv" else from_linear(terms, k, x.dtype)
    if op == "floormod":
        return BinOp("floormod", rest, const(c, x.dtype), x.dtype)
    return BinOp("floordiv", from_linear(terms, k, x.dtype), const(c, x.dtype), x.dtype)
