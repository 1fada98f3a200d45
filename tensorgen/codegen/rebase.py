"""Base pointers for micro-kernels: hoist the loop-invariant part of input indices out of the loop.

Inside an unrolled register tile every load recomputes its full index; with many accumulators GCC
keeps one address per unrolled access and spills. Taking `&B[invariant]` once before the loop that
encloses the tile leaves indices of the form `var*stride + constant`, which need one register.
"""

from __future__ import annotations

from collections.abc import Iterator

from tensorgen.loopir.nodes import Allocate, Buffer, BufLoad, For, Stmt, Store, statements, stmt_exprs
from tensorgen.loopir.simplify import from_linear, linear
from tensorgen.te.expr import Expr, Var, free_vars, walk


def buffer_loads(s: Stmt) -> Iterator[BufLoad]:
    """Every buffer load in `s`, statement by statement in program order."""
    for x in statements(s):
        for e in stmt_exprs(x):
            yield from (n for n in walk(e) if isinstance(n, BufLoad))


def allocates(s: Stmt) -> bool:
    return any(isinstance(x, Allocate) for x in statements(s))


def encloses_micro_kernel(loop: For) -> bool:
    """A serial loop directly around unrolled/vectorized loops, with no other serial loop between."""
    if loop.kind != "serial":
        return False
    inner = [x for x in statements(loop.body) if isinstance(x, For)]
    return bool(inner) and all(x.kind in ("unroll", "vectorize") for x in inner)


def invariant_bases(loop: For) -> dict[Buffer, Expr]:
    """Read-only pointer buffers whose loads in `loop` share one loop-invariant index part."""
    inner_vars: set[Var] = {loop.var} | {x.var for x in statements(loop.body) if isinstance(x, For)}
    written = {x.buffer for x in statements(loop.body) if isinstance(x, Store)}
    parts: dict[Buffer, dict[frozenset, dict]] = {}  # distinct invariant parts, first-seen term order kept
    for node in buffer_loads(loop.body):
        if node.buffer.scope in ("arg", "global") and node.buffer not in written:
            terms, _ = linear(node.index)
            inv = {a: c for a, c in terms.items() if not (free_vars(a) & inner_vars)}
            parts.setdefault(node.buffer, {}).setdefault(frozenset(inv.items()), inv)
    return {buf: from_linear(next(iter(p.values())), 0) for buf, p in parts.items()
            if len(p) == 1 and next(iter(p))}


def rebased_index(index: Expr, base: Expr) -> Expr:
    """`index - base` as a linear form (base's terms removed, constant kept)."""
    terms, c = linear(index)
    for atom, coef in linear(base)[0].items():
        terms[atom] = terms.get(atom, 0) - coef
    return from_linear({a: v for a, v in terms.items() if v}, c)
