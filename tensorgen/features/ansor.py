"""Ansor's per-statement program features (paper §5.2, Appendix B) computed from the loop IR.

One row per Store in program order (reduction init and update are separate statements, as in TVM).
The column layout is `layout.NAMES` (164 columns, TVM feature.cc order); magnitudes are stored as
log2(1 + x). Deviations from TVM forced by this loop IR, all deliberate:

- op counts include index arithmetic and the guards (`If` conditions) enclosing the statement;
  `mad` counts float/int add/sub whose operand is a multiply (the multiply still counts as `mul`);
  casts have their own column in place of TVM's `is_gpu` flag (GPU columns are zero on CPU).
- annotation position: a loop is *spatial* for a statement if the store index depends on it,
  *reduce* otherwise; inner/middle/outer is its rank among those loops. Several annotated loops of
  different positions give `mixed`.
- the arithmetic-intensity curve samples flops/unique-bytes at each loop level (innermost out),
  linearly interpolated against log2(flops) at 10 evenly spaced points up to the full nest.
- footprints, cache lines and reuse use the approximations documented in `features.access`.
- auto_unroll_max_step comes from the lowered function's `attrs["auto_unroll"]` ({stage name: step}).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensorgen.features.access import Access, BufferStats, buffer_stats, coefficients
from tensorgen.features.layout import (
    ANNOT_POS,
    BUF_WIDTH,
    CURVE_POINTS,
    N_BUFFERS,
    N_FEATURES,
    NAMES,
    OFF_ALLOC,
    OFF_BUF,
    OFF_CURVE,
    OFF_OTHER,
    OFF_PARALLEL,
    OFF_UNROLL,
    OFF_VEC,
    OP_CATEGORIES,
    log_scale,
)
from tensorgen.loopir.nodes import Allocate, BufLoad, For, If, PrimFunc, Seq, Stmt, Store
from tensorgen.target import HardwareParams
from tensorgen.te.expr import BinOp, Call, Cast, Cmp, Expr, Load, Logic, Select, is_float

__all__ = ["N_FEATURES", "NAMES", "Statement", "features_of", "ir_statements", "statement_features"]

OP_COLUMN = {c: k for k, c in enumerate(OP_CATEGORIES)}
_BIN_CAT = {"add": "addsub", "sub": "addsub", "mul": "mul", "div": "divmod", "floordiv": "divmod",
            "floormod": "divmod", "min": "maxmin", "max": "maxmin"}
_N_OPS = 2 * len(OP_CATEGORIES) + 3  # float, int, then bool / select / cast


@dataclass
class Statement:
    """What the features need of one statement, however it was found (lowered IR or `features.nest`)."""

    ids: tuple  # identity of each enclosing loop, outer to inner: statements under one loop share it
    extents: np.ndarray
    kinds: tuple[str, ...]  # serial | parallel | vectorize | unroll
    accesses: list[Access]  # the store first
    ops: np.ndarray  # operations per execution, by category (`_N_OPS` columns)
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
            accesses = [Access(s.buffer, True, *coefficients(s.index, loop_vars, extents))]
            accesses += [Access(ld.buffer, False, *coefficients(ld.index, loop_vars, extents)) for ld in loads]
            out.append(Statement(tuple(id(f) for f in loops), extents, tuple(f.kind for f in loops), accesses,
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


def count_ops(exprs: list[Expr]) -> tuple[np.ndarray, list[BufLoad | Load]]:
    """Operations per execution by category, and the distinct loads met on the way.

    Buffer loads count their flat index arithmetic; tensor loads (TE level) are leaves.
    """
    counts = np.zeros(_N_OPS)
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


def _annotation(kind: str, st: Statement, spatial: np.ndarray) -> np.ndarray:
    """num, prod, len of the innermost, and the one-hot position of `kind` loops around a statement."""
    out = np.zeros(3 + len(ANNOT_POS))
    idx = [k for k, k_kind in enumerate(st.kinds) if k_kind == kind]
    if not idx:
        out[3] = 1.0
        return out
    out[0], out[1], out[2] = len(idx), float(math.prod([st.extents[k] for k in idx])), st.extents[idx[-1]]
    pos = set()
    for k in idx:
        group = np.nonzero(spatial == spatial[k])[0]
        rank = "inner" if k == group[-1] else "outer" if k == group[0] else "middle"
        pos.add(f"{rank}_{'spatial' if spatial[k] else 'reduce'}")
    out[3 + ANNOT_POS.index(pos.pop() if len(pos) == 1 else "mixed")] = 1.0
    return out


def _curve(flops_per_exec: float, extents: np.ndarray, stats: list[BufferStats]) -> np.ndarray:
    """Arithmetic intensity (flops / unique bytes) per loop level, sampled at 10 points of log2 flops."""
    if flops_per_exec <= 0:
        return np.zeros(CURVE_POINTS)
    n = len(extents)
    inner = np.ones(n + 1)  # executions under loops k.., innermost level last
    if n:
        inner[:n] = np.cumprod(extents[::-1])[::-1]
    flops = (flops_per_exec * inner)[::-1]  # innermost (statement alone) first
    nbytes = np.sum([s.unique for s in stats], axis=0)[::-1] if stats else np.ones(n + 1)
    x, y = np.log2(flops), flops / np.maximum(nbytes, 1.0)
    keep = np.concatenate([[True], np.diff(x) > 1e-9])
    x, y = x[keep], y[keep]
    targets = x[-1] * np.arange(1, CURVE_POINTS + 1) / CURVE_POINTS
    return np.interp(targets, x, y)


def _buffer_row(st: BufferStats, stats: list[BufferStats], extents: np.ndarray, serial: list[int]) -> np.ndarray:
    """TVM's per-buffer record; reuse is found at the innermost loop that revisits data (serial[k]:
    statements touching the buffer under loop k)."""
    row = np.zeros(BUF_WIDTH)
    row[0 if not st.writes else 1 if not st.reads else 2] = 1.0
    row[3:7] = st.bytes, st.unique[0], st.lines, st.unique_lines
    reuse, dis_iter, dis_bytes, ct = 2, 0.0, 0.0, 0.0
    for k in range(len(extents) - 1, -1, -1):
        if extents[k] > 1 and (st.coefs[:, k] == 0).any():  # this loop revisits the same data
            reuse, ct = 0, float(extents[k])
        elif serial[k] > 1:  # several statements touch the buffer in the same loop body
            reuse, ct = 1, float(serial[k] - 1)
        else:
            continue
        dis_iter = float(math.prod(extents[k + 1:]))
        dis_bytes = float(sum(s.unique[k + 1] for s in stats))
        break
    row[7 + reuse] = 1.0
    row[10:13] = dis_iter, dis_bytes, ct
    div = ct if ct > 0.5 else 0.5  # no reuse: TVM's "multiply by 2"
    row[13:17] = np.array([st.bytes, st.unique[0], st.lines, st.unique_lines]) / div
    row[17] = st.stride
    return row


def statement_features(func: PrimFunc, hw: HardwareParams, log: bool = True) -> np.ndarray:
    """(n_statements, N_FEATURES) features of every Store of `func`, in program order."""
    return features_of(ir_statements(func), hw, log)


def features_of(stmts: list[Statement], hw: HardwareParams, log: bool = True) -> np.ndarray:
    """(n_statements, N_FEATURES) features of `stmts`, log-scaled unless `log` is False."""
    rows = np.zeros((len(stmts), N_FEATURES))
    # statements touching each buffer under each loop: the serial-reuse counter (TVM's for_touch_regions_)
    under: dict[tuple, int] = {}
    for st in stmts:
        names = {a.buffer.name for a in st.accesses}
        for lid in st.ids:
            for nm in names:
                under[(lid, nm)] = under.get((lid, nm), 0) + 1
    for r, st in enumerate(stmts):
        rows[r] = _row(st, hw, under)
    return log_scale(rows) if log else rows


def _row(st: Statement, hw: HardwareParams, under: dict[tuple, int]) -> np.ndarray:
    row = np.zeros(N_FEATURES)
    extents = st.extents
    trip = float(math.prod(extents))
    row[:_N_OPS] = st.ops * trip
    spatial = st.accesses[0].coef > 0
    row[OFF_VEC:OFF_VEC + 11] = _annotation("vectorize", st, spatial)
    row[OFF_UNROLL:OFF_UNROLL + 11] = _annotation("unroll", st, spatial)
    row[OFF_PARALLEL:OFF_PARALLEL + 11] = _annotation("parallel", st, spatial)

    stats = buffer_stats(st.accesses, extents, trip, hw.cache_line_bytes)
    float_ops = float(st.ops[:len(OP_CATEGORIES)].sum())
    row[OFF_CURVE:OFF_CURVE + CURVE_POINTS] = _curve(float_ops, extents, stats)

    ranked = sorted(stats, key=lambda s: (-s.bytes, -s.unique[0], s.buffer.name))[:N_BUFFERS]
    for b, bs in enumerate(ranked):
        serial = [under.get((lid, bs.buffer.name), 0) for lid in st.ids]
        row[OFF_BUF + b * BUF_WIDTH:OFF_BUF + (b + 1) * BUF_WIDTH] = _buffer_row(bs, stats, extents, serial)

    if st.alloc_outer is not None:
        buf = st.accesses[0].buffer
        row[OFF_ALLOC:OFF_ALLOC + 4] = buf.nbytes, buf.size * st.alloc_outer, st.alloc_outer, \
            trip / max(st.alloc_outer, 1.0)
    row[OFF_OTHER:OFF_OTHER + 3] = trip, len(extents), float(st.unroll)
    return row
