"""Which elements of a function's array arguments each thread touches, found by evaluating the index
expressions of its loop nest with NumPy.

OpenMP's static schedule gives thread t the t-th contiguous share of a parallel loop's iterations, so
the elements a thread writes or reads follow from the loop nest alone. A model's kernels hand their
outputs to the next kernel; when that one reads on one core what the previous one wrote on another,
the data comes over from the other core's cache: MobileNet-V2's depthwise convs ran 1.4-2x slower in
the model than when tuned, and their time returned when each thread's input had been written by itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tensorgen.loopir.nodes import Allocate, Buffer, BufLoad, For, If, Stmt, Store, children
from tensorgen.te.expr import BinOp, Cast, Cmp, Const, Expr, Logic, Select, Var, free_vars, walk

_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "floordiv": np.floor_divide,
           "div": np.floor_divide, "floormod": np.mod, "min": np.minimum, "max": np.maximum}
_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
        "ne": np.not_equal}


class NotAnIndex(TypeError):
    """An expression `evaluate` cannot compute from loop variables alone."""


def evaluate(e: Expr, env: dict[Var, np.ndarray]) -> np.ndarray:
    """An integer or boolean expression at every point of `env` (arrays of equal length per variable)."""
    if isinstance(e, Const):
        return np.asarray(e.value)
    if isinstance(e, Var):
        return env[e]
    if isinstance(e, BinOp):
        return _BINARY[e.op](evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, Cmp):
        return _CMP[e.op](evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, Logic):
        args = [evaluate(a, env) for a in e.args]
        if e.op == "not":
            return np.logical_not(args[0])
        return np.logical_and.reduce(args) if e.op == "and" else np.logical_or.reduce(args)
    if isinstance(e, Select):
        return np.where(evaluate(e.cond, env), evaluate(e.true_value, env), evaluate(e.false_value, env))
    if isinstance(e, Cast):
        return evaluate(e.value, env)
    raise NotAnIndex(f"cannot evaluate {type(e).__name__} in an index")


@dataclass(frozen=True)
class Access:
    buffer: Buffer
    store: bool
    index: Expr
    loops: tuple[For, ...]  # outermost first
    guards: tuple[Expr, ...]  # conditions of the enclosing Ifs

    @property
    def parallel(self) -> For | None:
        """The loop whose iterations are shared out among threads (the outermost parallel one)."""
        return next((f for f in self.loops if f.kind == "parallel"), None)


def accesses(s: Stmt, loops: tuple[For, ...] = (), guards: tuple[Expr, ...] = (),
             private: frozenset[Buffer] = frozenset()) -> Iterator[Access]:
    """Every store to and load from a buffer all threads share in `s`: the arguments, and the buffers
    allocated outside every loop (one allocated inside a loop is each thread's own)."""
    if isinstance(s, For):
        loops = (*loops, s)
    if isinstance(s, Allocate) and loops:
        private = private | {s.buffer}
    if isinstance(s, If):
        yield from accesses(s.then, loops, (*guards, s.cond), private)
        if s.orelse is not None:
            yield from accesses(s.orelse, loops, (*guards, Logic("not", (s.cond,))), private)
        return
    if isinstance(s, Store):
        if s.buffer not in private:
            yield Access(s.buffer, True, s.index, loops, guards)
        for e in walk(s.value):
            if isinstance(e, BufLoad) and e.buffer not in private:
                yield Access(e.buffer, False, e.index, loops, guards)
    for c in children(s):
        yield from accesses(c, loops, guards, private)


def static_thread(position: np.ndarray, extent: int, threads: int) -> np.ndarray:
    """The thread that runs iteration `position` of a loop of `extent` under schedule(static): the first
    extent % threads threads take one iteration more."""
    q, r = divmod(extent, threads)
    cut = r * (q + 1)
    return np.where(position < cut, position // (q + 1), r + (position - cut) // max(q, 1))


def points(access: Access, limit: int, rng: np.random.Generator) -> dict[Var, np.ndarray]:
    """Values of the loop variables the access depends on (its parallel loop's always): every combination
    when there are at most `limit`, else `limit` random ones."""
    needed = free_vars(access.index).union(*(free_vars(g) for g in access.guards))
    if access.parallel is not None:
        needed.add(access.parallel.var)
    loops = [f for f in access.loops if f.var in needed]
    if math.prod(f.extent for f in loops) <= limit:
        grid = np.meshgrid(*(np.arange(f.extent) for f in loops), indexing="ij") if loops else []
        return {f.var: g.ravel() for f, g in zip(loops, grid)}
    return {f.var: rng.integers(0, f.extent, limit) for f in loops}


def touched(access: Access, env: dict[Var, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(element index, iteration of the parallel loop or -1) at the points of `env` where the access runs
    and stays inside its buffer (a padded read outside it is a guarded one); none for an index that is
    not integer arithmetic of loop variables (a gather's index is data)."""
    n = max((len(v) for v in env.values()), default=1)
    try:
        index = np.broadcast_to(evaluate(access.index, env), (n,)).astype(np.int64)
        keep = (index >= 0) & (index < access.buffer.size)
        for g in access.guards:
            keep &= np.broadcast_to(evaluate(g, env), (n,)).astype(bool)
    except NotAnIndex:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    par = access.parallel
    iteration = env[par.var] if par is not None else np.full(n, -1)
    return index[keep], np.broadcast_to(iteration, (n,))[keep]
