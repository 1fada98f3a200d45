"""The loop-nest IR that states lower to and code generators render: flat buffers and plain loops."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from tensorgen.te.expr import DTYPE_BYTES, Expr, Var


@dataclass(frozen=True, eq=False)
class Buffer:
    """A flat array. scope: arg (function parameter), global (heap, whole function), local (in a loop)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: str
    strides: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        """Elements to allocate, strides included."""
        if not self.shape:
            return 1
        return sum((e - 1) * s for e, s in zip(self.shape, self.strides)) + 1

    @property
    def nbytes(self) -> int:
        return self.size * DTYPE_BYTES[self.dtype]


def row_major(shape: tuple[int, ...], align: tuple[tuple[int, int, int], ...] = ()) -> tuple[int, ...]:
    """Strides of a row-major layout; `align` entries (dim, factor, offset) pad dim's stride."""
    wanted = {d: (f, o) for d, f, o in align}
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        s = strides[d + 1] * shape[d + 1]
        if d in wanted:
            f, o = wanted[d]
            s += (o - s) % f
        strides[d] = s
    return tuple(strides)


@dataclass(frozen=True, repr=False)
class BufLoad(Expr):
    buffer: Buffer
    index: Expr
    dtype: str
    _kids = ("index",)


class Stmt:
    pass


@dataclass(frozen=True, eq=False)
class For(Stmt):
    """`for var in range(extent)`; kind: serial|parallel|vectorize|unroll. `unroll_hint` asks for
    `#pragma unroll` (from auto_unroll_max_step)."""

    var: Var
    extent: int
    kind: str
    body: Stmt
    unroll_hint: bool = False


@dataclass(frozen=True, eq=False)
class Store(Stmt):
    buffer: Buffer
    index: Expr
    value: Expr


@dataclass(frozen=True, eq=False)
class Allocate(Stmt):
    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, eq=False)
class If(Stmt):
    cond: Expr
    then: Stmt
    orelse: Stmt | None = None


@dataclass(frozen=True, eq=False)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


def children(s: Stmt) -> list[Stmt]:
    if isinstance(s, Seq):
        return list(s.stmts)
    if isinstance(s, (For, Allocate)):
        return [s.body]
    if isinstance(s, If):
        return [s.then] + ([s.orelse] if s.orelse is not None else [])
    return []


def statements(s: Stmt) -> Iterator[Stmt]:
    """`s` and every statement inside it, pre-order."""
    yield s
    for c in children(s):
        yield from statements(c)


def stmt_exprs(s: Stmt) -> tuple[Expr, ...]:
    """The expressions of `s` itself (not of the statements inside it)."""
    if isinstance(s, Store):
        return (s.index, s.value)
    if isinstance(s, If):
        return (s.cond,)
    return ()


def top_level(s: Stmt) -> Iterator[Stmt]:
    """The statements of a function body outside every loop, looking through sequences and allocations."""
    if isinstance(s, Seq):
        for x in s.stmts:
            yield from top_level(x)
    elif isinstance(s, Allocate):
        yield from top_level(s.body)
    else:
        yield s


def seq(*stmts: Stmt | None) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        flat.extend(s.stmts if isinstance(s, Seq) else [s])
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


@dataclass(frozen=True, eq=False)
class PrimFunc:
    name: str
    args: tuple[Buffer, ...]
    body: Stmt
    attrs: dict = field(default_factory=dict)
