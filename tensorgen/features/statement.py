"""Statements as the features see them, and how to find them in a lowered function.

A `Statement` is one Store with everything around it that the features need: its enclosing loops,
the per-loop strides of its accesses and its operation counts. `ir_statements` reads them off the
loop IR; `features.nest` derives the same from a State without lowering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensorgen.features.access import THREAD_AXES, Access, coefficients, index_values, warp_lanes
from tensorgen.features.layout import OP_CATEGORIES
from tensorgen.loopir.nodes import Allocate, BufLoad, For, If, PrimFunc, Seq, Stmt, Store
from tensorgen.te.expr import BinOp, Call, Cast, Cmp, Expr, Load, Logic, Select, is_float

OP_COLUMN = {c: k for k, c in enumerate(OP_CATEGORIES)}
_BIN_CAT = {"add": "addsub", "sub": "addsub", "mul": "mul", "div": "divmod", "floordiv": "divmod",
            "floormod": "divmod", "min": "maxmin", "max": "maxmin"}
N_OPS = 2 * len(OP_CATEGORIES) + 3  # float, int, then bool / select / cast



@dataclass
class Statement:
    """What the features need of one statement, however it was found (lowered IR or `features.nest`)."""

    ids: tuple  # identity of each enclosing loop, outer to inner: statements under one loop share it
    extents: np.ndarray
    kinds: tuple[str, ...]  # serial | parallel | vectorize | unroll
    accesses: list[Access]  # the store first
    ops: np.ndarray  # operations per execution, by category (`N_OPS` columns)
    alloc_outer: float | None  # executions of the store buffer's allocation (None: an argument)
    unroll: int  # auto_unroll_max_step of the stage


def ir_statements(func: PrimFunc) -> list[Statement]:
    """Every Store of a lowered function with its loops, guards and accesses, in program order."""
    auto_unroll = func.attrs.get("auto_unroll", {})
    out: list[Statement] = []

    def visit(s: Stmt, loops: tuple[For, ...], conds: tuple[Expr, ...], allocs: dict[str, float]) -> None:
        if isinstance(s, Store):
            ops, loads = count_ops([s.value, s.index, *conds])
            loop_vars = [f.var for f in loops]
            extents = np.array([f.extent for f in loops], dtype=float)
            kinds = tuple(f.kind for f in loops)
            # in a GPU kernel, where each lane of a warp reads: exact where index arithmetic is not affine
            env = {id(v): lane.astype(np.int64) for v, lane in zip(loop_vars, warp_lanes(kinds, extents))} \
                if any(k in THREAD_AXES for k in kinds) else None
            accesses = [Access(s.buffer, True, *coefficients(s.index, loop_vars, extents),
                               _lanes(s.index, env))]
            accesses += [Access(ld.buffer, False, *coefficients(ld.index, loop_vars, extents), _lanes(ld.index, env))
                         for ld in loads if isinstance(ld, BufLoad)]  # a tensor load left in an index is a leaf
            out.append(Statement(tuple(id(f) for f in loops), extents, kinds, accesses,
                                 ops, allocs.get(s.buffer.name), auto_unroll.get(s.buffer.name, 0)))
        elif isinstance(s, For):
            visit(s.body, loops + (s,), conds, allocs)
        elif isinstance(s, Seq):
            for x in s.stmts:
                visit(x, loops, conds, allocs)
        elif isinstance(s, If):
            visit(s.then, loops, conds + (s.cond,), allocs)
            if s.orelse is not None:
                visit(s.orelse, loops, conds, allocs)
        elif isinstance(s, Allocate):
            visit(s.body, loops, conds, {**allocs, s.buffer.name: float(math.prod([f.extent for f in loops]))})

    visit(func.body, (), (), {})
    return out


def _lanes(index: Expr, env: dict | None) -> np.ndarray | None:
    """The index at each lane of a warp (`env`: the loop variables' values there), None outside GPU kernels or where
    it is not integer arithmetic."""
    if env is None:
        return None
    values = index_values(index, env)
    return None if values is None else np.broadcast_to(values, (next(iter(env.values())).shape)).astype(float)


def count_ops(exprs: list[Expr]) -> tuple[np.ndarray, list[BufLoad | Load]]:
    """Operations per execution by category, and the distinct loads met on the way.

    Buffer loads count their flat index arithmetic; tensor loads (TE level) are leaves.
    """
    counts = np.zeros(N_OPS)
    loads: list[BufLoad] = []
    stack = list(exprs)
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if id(e) in seen:  # shared subtrees (the store index reused by the accumulator load) count once: CSE
            continue
        seen.add(id(e))
        if isinstance(e, BinOp):
            cat = _BIN_CAT.get(e.op)
            if cat == "addsub" and (_is_mul(e.a) or _is_mul(e.b)):
                cat = "mad"
            if cat is not None:
                counts[OP_COLUMN[cat] + (0 if is_float(e.dtype) else len(OP_CATEGORIES))] += 1
        elif isinstance(e, Cmp):
            counts[OP_COLUMN["cmp"] + (0 if is_float(e.a.dtype) else len(OP_CATEGORIES))] += 1
        elif isinstance(e, Call):
            counts[OP_COLUMN["math_func"] + (0 if is_float(e.dtype) else len(OP_CATEGORIES))] += 1
        elif isinstance(e, Logic):
            counts[-3] += 1
        elif isinstance(e, Select):
            counts[-2] += 1
        elif isinstance(e, Cast):
            counts[-1] += 1
        elif isinstance(e, (BufLoad, Load)):
            loads.append(e)
            if isinstance(e, Load):
                continue
        stack.extend(e.children())
    return counts, loads


def _is_mul(e: Expr) -> bool:
    return isinstance(e, BinOp) and e.op == "mul"
