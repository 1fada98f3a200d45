"""Align the thread partitions of a model's consecutive kernels (ALT's point that a producer and its
consumer must agree, applied to which core holds which part of a tensor).

Each kernel was tuned alone, so its parallel loop shares out its iterations in whatever order its tile
loops were fused: a 1x1 conv may give each thread half of the channels, the depthwise conv after it half
of the columns. The depthwise conv then reads half of its input from the other core's cache, and it has
too little arithmetic to hide that: MobileNet-V2's ran 1.4-2x slower in the model than when tuned.

A fused parallel loop's iterations are independent, so visiting them in another order changes nothing but
which thread runs which: the body decodes its variable as a mixed-radix number (one digit per fused
loop), and permuting the digits permutes the iterations. `align_partitions` picks, kernel by kernel,
the permutation under which the fewest bytes are read on another core than they were written on
(found by `loopir.footprint`), counting too the weight panels a permutation would make threads reload.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tensorgen.codegen import prefetch
from tensorgen.loopir.footprint import NotAnIndex, accesses, evaluate, points, static_thread, touched
from tensorgen.loopir.nodes import (
    Allocate,
    Buffer,
    For,
    If,
    PrimFunc,
    Seq,
    Stmt,
    Store,
    statements,
    stmt_exprs,
    top_level,
)
from tensorgen.loopir.simplify import simplify
from tensorgen.te.expr import BinOp, Const, Expr, const, free_vars, substitute, walk

SAMPLES = 50_000  # read points sampled per argument of a loop
CACHED_WEIGHTS = 1 << 20  # bytes of a weight that stays in the caches however its panels are visited
MAX_OWNED = 1 << 22  # output elements enumerated to know their writers (more are sampled)
#: Loops of more iterations, or writing a value of more elements, keep their tuned order unexamined: the
#: analysis holds arrays of one entry per iteration and per element written (a [100000, 100000] buffer
#: would take 10 GB), and kernels that large spend too long in each iteration for the order to matter.
MAX_ALIGNED = 1 << 26


def digits(loop: For) -> list[int]:
    """Radices, least significant first, of the mixed-radix number the body decodes the loop variable as:
    a loop fused from loops of extents (a, b) is read as var // b and var % b."""
    cuts = {1, loop.extent}
    for stmt in statements(loop.body):
        for e in stmt_exprs(stmt):
            for n in walk(e):
                if (isinstance(n, BinOp) and n.op in ("floordiv", "floormod") and n.a is loop.var
                        and isinstance(n.b, Const) and 1 < n.b.value < loop.extent):
                    cuts.add(int(n.b.value))
    bounds = sorted(cuts)
    if any(hi % lo for lo, hi in zip(bounds, bounds[1:])):
        return [loop.extent]
    return [hi // lo for lo, hi in zip(bounds, bounds[1:])]


def position(iteration: np.ndarray, radices: Sequence[int], order: Sequence[int]) -> np.ndarray:
    """Where `iteration` runs when the loop visits its digits most significant first in `order`."""
    strides = np.cumprod([1, *radices[:-1]])
    out = np.zeros_like(iteration)
    for d in order:
        out = out * radices[d] + iteration // strides[d] % radices[d]
    return out


def reorder(loop: For, radices: Sequence[int], order: Sequence[int]) -> For:
    """`loop` visiting its iterations in digit `order`: its variable counts positions, and the body gets
    back the iteration it ran before at that position."""
    strides = [int(s) for s in np.cumprod([1, *radices[:-1]])]
    v = loop.var
    iteration: Expr = const(0, v.dtype)
    below = 1
    for d in reversed(order):  # least significant digit of the position first
        iteration = iteration + (v // below) % radices[d] * strides[d]
        below *= radices[d]
    ranges = {f.var: (0, f.extent - 1) for f in _loops(loop)}
    body = _map_exprs(loop.body, lambda e: simplify(substitute(e, {v: iteration}), ranges))
    return replace(loop, body=body)


@dataclass
class _Loop:
    """A top-level parallel loop of a kernel: the orders it may take (tuned first) and the argument elements
    its iterations read and write, as (value, element, iteration, argument buffer)."""

    kernel: int
    loop: For
    radices: list[int]
    orders: list[tuple[int, ...]]
    reads: list[tuple[str, np.ndarray, np.ndarray, Buffer]]
    writes: list[tuple[str, np.ndarray, np.ndarray, Buffer]]
    panels: list[tuple[np.ndarray, int]]  # per weight read: which panel each iteration reads, panel bytes

    def thread(self, iteration: np.ndarray, order: Sequence[int], threads: int) -> np.ndarray:
        each = np.arange(self.loop.extent)
        return static_thread(position(each, self.radices, order), self.loop.extent, threads)[iteration]

    def extra_weight_bytes(self, order: Sequence[int], threads: int) -> float:
        """Bytes of weights `order` loads more than the tuned order, counting a panel load whenever a
        thread's next iteration reads another panel than its last. A matmul that walks its weight panels
        in the outer digit keeps each in cache for a run of iterations; moved inside, it reloads one per
        iteration (BERT-base's FFN matmul ran 2.3x slower so). Weights that fit the cache never count."""
        def loads(o: Sequence[int]) -> float:
            run = np.argsort(position(np.arange(self.loop.extent), self.radices, o))  # iteration of each step
            switch = np.diff(static_thread(np.arange(self.loop.extent), self.loop.extent, threads)) != 0
            return sum((1 + np.count_nonzero((np.diff(p[run]) != 0) | switch)) * n for p, n in self.panels)

        return max(0.0, loads(order) - loads(self.orders[0])) if self.panels else 0.0


def align_partitions(funcs: Sequence[PrimFunc], values: Sequence[Sequence[str]], threads: int) -> list[PrimFunc]:
    """`funcs` (a model's kernels in execution order; `values[k]`: the value each argument of kernel k
    holds) with their top-level parallel loops reordered so that threads read what they wrote.

    Loops are decided in execution order, each by the bytes its threads read from elements another thread
    wrote plus what its readers then read so, each reader in its best order (a depthwise conv that takes
    its producer's channel split hands a channel split to the 1x1 conv after it, which needs every
    channel of its pixels), plus the weight bytes an order reloads beyond the tuned one. The tuned order
    stays unless another saves a fifth of that and 16 KB."""
    if threads < 2:
        return list(funcs)
    rng = np.random.default_rng(0)
    loops = [info for k, (func, names) in enumerate(zip(funcs, values))
             for loop in top_level(func.body) if isinstance(loop, For) and loop.kind == "parallel"
             if (info := _loop(k, loop, func, names, rng)) is not None]
    owner: dict[str, np.ndarray] = {}  # value -> the thread that writes each element (-1: not known)
    for info in loops:
        _write(owner, info, info.orders[0], threads)
    chosen: dict[int, tuple[int, ...]] = {}
    read = [{x[0] for x in r.reads} for r in loops]
    for info in loops:
        written = {w[0] for w in info.writes}
        readers = [r for r, values in zip(loops, read) if r.kernel > info.kernel and written & values]

        def cost(order: tuple[int, ...], info: _Loop = info, readers: list[_Loop] = readers) -> float:
            mine = dict(owner)
            _write(mine, info, order, threads)
            return _remote(info, order, owner, threads) + info.extra_weight_bytes(order, threads) + sum(
                min(_remote(r, o, mine, threads) + r.extra_weight_bytes(o, threads) for o in r.orders)
                for r in readers)

        costs = {order: cost(order) for order in info.orders}
        best = min(costs, key=costs.get)
        tuned = info.orders[0]
        if costs[tuned] - costs[best] > max(0.2 * costs[tuned], 16 * 1024):
            chosen[id(info.loop)] = best
            _write(owner, info, best, threads)
    out = []
    for func in funcs:
        body = _map_top_parallel(func.body, lambda loop: reorder(loop, digits(loop), chosen[id(loop)])
                                 if id(loop) in chosen else loop)
        out.append(replace(func, body=body) if body is not func.body else func)
    return out


def _loop(kernel: int, loop: For, func: PrimFunc, names: Sequence[str], rng: np.random.Generator) -> _Loop | None:
    """The loop's analysis, or None when it is too large to analyse (MAX_ALIGNED)."""
    if loop.extent > MAX_ALIGNED:
        return None
    value_of = {buf.name: name for buf, name in zip(func.args, names)}
    inputs = {b.name for b in func.args[:len(func.args) - func.attrs.get("n_outputs", 1)]}
    reads, writes = [], []
    for a in accesses(loop):  # arguments, and the kernel's own shared buffers (a padded copy of its input)
        if a.store and a.buffer.name in inputs:
            continue
        if a.store and a.buffer.size > MAX_ALIGNED:
            return None
        value = value_of.get(a.buffer.name, f"{func.name}/{a.buffer.name}")
        index, iteration = touched(a, points(a, MAX_OWNED if a.store else SAMPLES, rng))
        (writes if a.store else reads).append((value, index, iteration, a.buffer))
    radices = digits(loop)
    tuned = tuple(reversed(range(len(radices))))
    constants = set(func.attrs.get("constants", ()))
    fixed = sum(r > 1 for r in radices) < 2 or prefetch.plan(loop, constants)
    orders = [tuned] + ([] if fixed else [o for o in itertools.permutations(tuned) if o != tuned])
    return _Loop(kernel, loop, radices, orders, reads, writes, _panels(loop, constants))


def _panels(loop: For, constants: set[str]) -> list[tuple[np.ndarray, int]]:
    """For each read of a weight that depends on the loop variable: the offset it starts at in each
    iteration (its panel), and the bytes of a panel (the weight split evenly among the distinct ones)."""
    out = []
    for a in accesses(loop):
        if (a.store or a.buffer.name not in constants or a.buffer.nbytes < CACHED_WEIGHTS
                or loop.var not in free_vars(a.index)):
            continue
        env = {v: np.zeros(loop.extent, np.int64) for v in free_vars(a.index)}
        env[loop.var] = np.arange(loop.extent)
        try:
            start = np.broadcast_to(evaluate(a.index, env), (loop.extent,))
        except NotAnIndex:
            continue
        out.append((start, a.buffer.nbytes // len(np.unique(start))))
    return out


def _write(owner: dict[str, np.ndarray], info: _Loop, order: Sequence[int], threads: int) -> None:
    for value, index, iteration, buffer in info.writes:
        if value not in owner or owner[value].size != buffer.size:
            owner[value] = np.full(buffer.size, -1, np.int8)
        else:
            owner[value] = owner[value].copy()  # the dict may be a copy sharing the arrays
        owner[value][index] = info.thread(iteration, order, threads)


def _remote(info: _Loop, order: Sequence[int], owner: dict[str, np.ndarray], threads: int) -> float:
    """Bytes of its arguments the loop's threads read where another thread wrote them."""
    out = 0.0
    for value, index, iteration, buffer in info.reads:
        if value in owner and len(index):
            wrote = owner[value][np.minimum(index, owner[value].size - 1)]
            out += np.mean((wrote >= 0) & (wrote != info.thread(iteration, order, threads))) * buffer.nbytes
    return out


def _map_top_parallel(s: Stmt, fn: Callable[[For], For]) -> Stmt:
    """`s` with `fn` applied to its parallel loops that are not inside another loop."""
    if isinstance(s, Seq):
        stmts = tuple(_map_top_parallel(x, fn) for x in s.stmts)
        return s if all(a is b for a, b in zip(stmts, s.stmts)) else Seq(stmts)
    if isinstance(s, Allocate):
        body = _map_top_parallel(s.body, fn)
        return s if body is s.body else replace(s, body=body)
    if isinstance(s, For) and s.kind == "parallel":
        return fn(s)
    return s


def _map_exprs(s: Stmt, fn: Callable[[Expr], Expr]) -> Stmt:
    if isinstance(s, Seq):
        return Seq(tuple(_map_exprs(x, fn) for x in s.stmts))
    if isinstance(s, (For, Allocate)):
        return replace(s, body=_map_exprs(s.body, fn))
    if isinstance(s, If):
        return If(fn(s.cond), _map_exprs(s.then, fn), None if s.orelse is None else _map_exprs(s.orelse, fn))
    if isinstance(s, Store):
        return replace(s, index=fn(s.index), value=fn(s.value))
    return s


def _loops(s: Stmt) -> list[For]:
    return [x for x in statements(s) if isinstance(x, For)]


